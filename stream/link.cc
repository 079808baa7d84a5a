#include "stream/link.h"

#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace gs::stream {
namespace {

uint8_t* allocatePages(size_t bytes) {
  void* p = nullptr;
  GS_CHECK(posix_memalign(&p, 4096, bytes) == 0, Errc::kNoMemory,
           "cannot allocate %zu bytes of receive slots", bytes);
  memset(p, 0, bytes);
  return static_cast<uint8_t*>(p);
}

}  // namespace

void Link::FreeDeleter::operator()(uint8_t* p) const noexcept {
  free(p);
}

Link::Link(int peer, transport::Device& device, const SlotLayout& layout)
    : arrivedBytes(layout.slots, kNotArrived),
      slotInUse(layout.slots, 0),
      landedInPlace(layout.slots, 0),
      headerBusy(layout.slots, 0),
      peer_(peer),
      device_(&device),
      layout_(layout),
      headers_(allocatePages(layout.slots * kHeaderStride + SlotLayout::kNoticeBytes)) {
  recvSlotsMr_ = device.allocateRegion(layout.regionBytes());
  headersMr_ = device.registerMemory(headers_.get(),
                                     layout.slots * kHeaderStride + SlotLayout::kNoticeBytes);
}

void Link::ensureEncodeStaging() {
  if (encode_)
    return;
  const size_t bytes = layout_.slots * layout_.slotBytes();
  encode_.reset(allocatePages(bytes));
  encodeMr_ = device_->registerMemory(encode_.get(), bytes);
}

void Link::attach(std::unique_ptr<transport::Connection> connection,
                  const transport::RemoteKey& slots) {
  connection_ = std::move(connection);
  peerSlots = slots;
}

}  // namespace gs::stream
