#include "transport/device.h"

#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace gs::transport {
namespace {

// Heap pages and their registration; the registration goes first.
class OwnedRegion final : public MemoryRegion {
 public:
  OwnedRegion(void* data, size_t bytes, Device& device) : MemoryRegion(data, bytes), memory_(data) {
    try {
      registration_ = device.registerMemory(data, bytes);
    } catch (...) {
      free(data);
      throw;
    }
  }
  ~OwnedRegion() override {
    registration_.reset();
    free(memory_);
  }
  RemoteKey remoteKey() const override { return registration_->remoteKey(); }
  const MemoryRegion& registered() const override { return registration_->registered(); }

 private:
  void* memory_;
  std::unique_ptr<MemoryRegion> registration_;
};

}  // namespace

std::unique_ptr<MemoryRegion> Device::allocateRegion(size_t bytes) {
  void* p = nullptr;
  GS_CHECK(posix_memalign(&p, 4096, bytes == 0 ? 4096 : bytes) == 0, Errc::kNoMemory,
           "cannot allocate %zu bytes of registered memory", bytes);
  memset(p, 0, bytes);
  return std::make_unique<OwnedRegion>(p, bytes, *this);
}

}  // namespace gs::transport
