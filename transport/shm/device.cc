// Placeholder while the shm backend is written: every shm device refuses to open.
#include "transport/shm/device.h"

#include "common/error.h"

namespace gs::transport::shm {

bool sameDomain(std::span<const uint8_t>, std::span<const uint8_t>) {
  return false;
}

Device::Device(const DeviceOptions&) {
  throw Error(Errc::kUnsupported, "shm transport: not built yet");
}
Device::~Device() = default;
DeviceProperties Device::properties() const { return {}; }
std::unique_ptr<transport::MemoryRegion> Device::registerMemory(void*, size_t) { return nullptr; }
std::unique_ptr<transport::MemoryRegion> Device::allocateRegion(size_t) { return nullptr; }
std::vector<uint8_t> Device::address() const { return {}; }
std::unique_ptr<transport::Connection> Device::connect(int, std::span<const uint8_t>, Deadline) {
  return nullptr;
}
void Device::waitForActivity(std::chrono::microseconds) {}
void Device::interrupt() {}
void Device::attach(Connection*) {}
void Device::detach(Connection*) {}

}  // namespace gs::transport::shm
