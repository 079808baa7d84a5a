// gs_comm_register / gs_comm_deregister: buffers the caller keeps allocated, whose transport
// registrations the engine may then keep across calls (Engine::keepUserBuffer).
#include "common/error.h"
#include "control/communicator.h"

namespace gs::control {

void Communicator::registerBuffer(void* data, size_t bytes) {
  checkUsable();
  std::lock_guard<std::mutex> lock(execMutex_);  // the engine's plans: not while one runs
  engine_->keepUserBuffer(data, bytes);
}

void Communicator::deregisterBuffer(void* data) {
  std::lock_guard<std::mutex> lock(execMutex_);
  GS_CHECK(engine_->forgetUserBuffer(data), Errc::kInvalidArgument,
           "gs_comm_deregister: handle %p is no registration of this communicator (rank %d)", data,
           rank_);
  metrics_->setBufferRegistrations(engine_->bufferRegistrations(),
                                   engine_->bufferRegisteredBytes());
}

}  // namespace gs::control
