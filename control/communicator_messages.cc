// Point-to-point messages on a communicator (gs_send / gs_recv / gs_isend / gs_irecv): they
// share the request queue with the collectives, so everything completes in issue order, and
// the progress thread runs a series of consecutive messages as one engine run that messages
// posted later join (both ends of an exchange may post their sends first).
#include <chrono>

#include "common/error.h"
#include "common/log.h"
#include "control/communicator.h"

namespace gs::control {

namespace {
stream::PointToPointOp opOf(const stream::CollectiveArgs& a) {
  stream::PointToPointOp op;
  op.send = a.sending;
  op.peer = a.peer;
  op.buffer = a.sending ? const_cast<void*>(a.send) : a.recv;
  op.count = a.count;
  op.dtype = a.dtype;
  return op;
}

}  // namespace

void Communicator::checkMessage(const stream::CollectiveArgs& args,
                                CUstream_st* cudaStream,
                                int device) const {
  // The peer is checked where the call enters (capi) and again by the engine.
  GS_CHECK(device < 0 && cudaStream == nullptr, Errc::kUnsupported,
           "point-to-point messages take host buffers and no CUDA stream for now (%s)",
           device >= 0 ? "the buffer is device memory" : "a stream was given");
}

void Communicator::runMessage(const stream::CollectiveArgs& args) {
  auto request = submit(args, nullptr);
  // The engine bounds the wait (the timeout, a peer's failure); this thread usually runs the
  // message itself (wait()).
  while (!wait(request, Deadline::afterMs(60'000))) {
  }
  if (request->status() != Errc::kOk)
    throw Error(request->status(), request->message());
}

void Communicator::runMessages(const std::shared_ptr<Request>& first, const Request* waiter) {
  std::vector<std::shared_ptr<Request>> batch{first};
  size_t completed = 0;
  uint64_t bytes = 0;
  stream::PointToPointFeed feed;
  feed.more = [&] {
    std::vector<stream::PointToPointOp> ops;
    if (waiter != nullptr && waiter->done())
      return ops;  // the waiting thread goes back to its caller; the progress thread goes on
    std::lock_guard<std::mutex> lock(queueMutex_);
    while (!queue_.empty() && queue_.front()->isMessage()) {
      batch.push_back(queue_.front());
      ops.push_back(opOf(queue_.front()->args()));
      queue_.pop_front();
    }
    return ops;
  };
  feed.completed = [&](size_t index) {
    const auto& a = batch[index]->args();
    bytes += a.count * elementSize(a.dtype);
    completed = index + 1;
    batch[index]->complete(Errc::kOk, "");
  };
  try {
    std::lock_guard<std::mutex> lock(execMutex_);
    checkUsable();
    stream::CollectiveArgs base;
    base.kind = stream::CollectiveKind::kPointToPoint;
    // Floats the codec supports travel encoded (engine: per message); codec=auto follows the
    // controller's rung per link, as the collectives left it.
    base.codec = codec_.get();
    base.adaptive = controller_ != nullptr;
    try {
      metrics_->beginCollective();
      engine_->runPointToPoint(base, {opOf(first->args())}, feed);
      stream::CollectiveArgs summary;
      summary.kind = stream::CollectiveKind::kPointToPoint;
      summary.dtype = DataType::kUInt8;
      summary.count = bytes;
      recordCollective(summary, static_cast<double>(engine_->lastStats().elapsedNs) * 1e-9);
    } catch (const Error& e) {
      fail(e);
      throw;
    }
  } catch (const Error& e) {
    for (size_t i = completed; i < batch.size(); ++i)
      batch[i]->complete(e.code(), e.what());
  } catch (const std::exception& e) {
    for (size_t i = completed; i < batch.size(); ++i)
      batch[i]->complete(Errc::kInternal, e.what());
  }
}

}  // namespace gs::control
