// Buffers the caller registered (gs_comm_register, like NCCL's ncclCommRegister): plans inside
// them keep their device registrations across calls. Without it a device that pins pages
// (verbs) registers the caller's buffers at every call and drops them after, because nothing
// tells it the memory is still the caller's afterwards.
#include <algorithm>

#include "common/error.h"
#include "stream/engine_run.h"

namespace gs::stream {

namespace {

struct Range {
  uintptr_t begin, end;
};

Range rangeOf(const transport::MemoryRegion* r) {
  const auto begin = reinterpret_cast<uintptr_t>(r->data());
  return {begin, begin + r->size()};
}

}  // namespace

std::shared_ptr<transport::MemoryRegion> Engine::registerUserMemory(transport::Device& device,
                                                                    void* data,
                                                                    size_t bytes) {
  // Plans over one buffer differ by schedule (the candidates GS_ALGO_TUNE measures) or codec;
  // each registering it anew would pin its pages again on verbs and break "registered once".
  auto same = [&](const std::shared_ptr<transport::MemoryRegion>& r) {
    return r != nullptr && r->data() == data && r->size() == bytes;
  };
  for (const auto& p : prepared_) {
    if (&device == &device_) {
      for (const auto* r : {&p->sendRegion, &p->recvRegion}) {
        if (same(*r))
          return *r;
      }
    }
    for (const auto& other : p->otherRegions) {
      if (other.device == &device && same(other.region))
        return other.region;
    }
  }
  std::shared_ptr<transport::MemoryRegion> region = device.registerMemory(data, bytes);
  ++bufferRegistrations_;
  bufferRegisteredBytes_ += bytes;
  return region;
}

void Engine::keepUserBuffer(const void* data, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  GS_CHECK(data != nullptr && bytes > 0 && begin + bytes > begin, Errc::kInvalidArgument,
           "a buffer to register needs an address and a size (got %p, %zu bytes)", data, bytes);
  GS_CHECK(std::none_of(userBuffers_.begin(), userBuffers_.end(),
                        [&](const UserBuffer& u) { return u.begin == begin; }),
           Errc::kInvalidArgument, "the buffer at %p is registered already", data);
  userBuffers_.push_back({begin, begin + bytes});
}

bool Engine::forgetUserBuffer(const void* data) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  auto it = std::find_if(userBuffers_.begin(), userBuffers_.end(),
                         [&](const UserBuffer& u) { return u.begin == begin; });
  if (it == userBuffers_.end())
    return false;
  const UserBuffer gone = *it;
  userBuffers_.erase(it);
  // Plans touching the range may hold registrations of its pages: they go with it (a plan still
  // inside another registered range is rebuilt at its next call, at the cost of registering).
  std::erase_if(prepared_, [&](const std::unique_ptr<Prepared>& p) {
    for (const transport::MemoryRegion* r : {p->sendRegion.get(), p->recvRegion.get()}) {
      if (r != nullptr && rangeOf(r).begin < gone.end && gone.begin < rangeOf(r).end)
        return true;
    }
    return false;
  });
  return true;
}

bool Engine::keptByUser(const Prepared& p) const {
  for (const transport::MemoryRegion* r : {p.sendRegion.get(), p.recvRegion.get()}) {
    if (r == nullptr)
      continue;
    const Range need = rangeOf(r);
    const bool inside = std::any_of(
        userBuffers_.begin(), userBuffers_.end(),
        [&](const UserBuffer& u) { return u.begin <= need.begin && need.end <= u.end; });
    if (!inside)
      return false;
  }
  return p.sendRegion != nullptr || p.recvRegion != nullptr;
}

}  // namespace gs::stream
