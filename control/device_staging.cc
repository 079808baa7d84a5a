#include "control/device_staging.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "codecs/codec.h"
#include "common/clock.h"
#include "common/error.h"

namespace gs::control {
namespace {

using stream::CollectiveKind;

bool isBlockwise(CollectiveKind kind) {
  return kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllGather ||
         kind == CollectiveKind::kAllToAll;
}

}  // namespace

CurrentDevice::CurrentDevice(codecs::DeviceMemory& memory, int device)
    : memory_(memory), previous_(memory.setDevice(device)), device_(device) {}

CurrentDevice::~CurrentDevice() {
  if (previous_ != device_) {
    try {
      memory_.setDevice(previous_);
    } catch (const Error&) {
      // The device reports the failure again on the caller's next call.
    }
  }
}

StreamMark::StreamMark(std::shared_ptr<codecs::DeviceMemory> memory,
                       codecs::DeviceMemory::Stream stream,
                       int bufferDevice)
    : memory_(std::move(memory)), device_(memory_->streamDevice(stream)) {
  GS_CHECK(bufferDevice < 0 || bufferDevice == device_, Errc::kInvalidArgument,
           "cuda_stream belongs to CUDA device %d but the buffers are on device %d", device_,
           bufferDevice);
  CurrentDevice current(*memory_, device_);
  event_ = memory_->createEvent();
  try {
    memory_->record(event_, stream);
  } catch (...) {
    memory_->destroyEvent(event_);
    throw;
  }
}

StreamMark::~StreamMark() {
  memory_->destroyEvent(event_);
}

int collectiveDevice(codecs::DeviceMemory& memory, const stream::CollectiveArgs& args) {
  const int send = memory.deviceOf(args.send);
  const int recv = memory.deviceOf(args.recv);
  GS_CHECK(send < 0 || recv < 0 || send == recv, Errc::kInvalidArgument,
           "sendbuff is on CUDA device %d and recvbuff on device %d: a collective's buffers "
           "share one device",
           send, recv);
  return send >= 0 ? send : recv;
}

// Where a call's pieces lie. Piece k is the element range [k * perPiece, +count) of every
// block of the user's buffers (one block, or nranks for reduce-scatter / allgather), staged
// densely in slot k % 2: block b's range at b * bytes. The host collective runs in place on the
// slot (NCCL's in-place layouts), so one slot serves both directions.
struct DeviceStaging::Layout {
  const stream::CollectiveArgs& args;
  int rank;
  size_t esize;
  size_t blocks;
  size_t perPiece;  // elements of a block's range in one piece
  uint8_t* const* slots;

  size_t pieces() const { return (args.count + perPiece - 1) / perPiece; }
  size_t count(size_t index) const { return std::min(perPiece, args.count - index * perPiece); }
  size_t bytes(size_t index) const { return count(index) * esize; }
  size_t offsetBytes(size_t index) const { return index * perPiece * esize; }
  size_t blockBytes() const { return args.count * esize; }  // the pitch between ranges
  uint8_t* slot(size_t index) const { return slots[index & 1]; }
  uint8_t* ownBlock(size_t index) const {
    return slot(index) + static_cast<size_t>(rank) * bytes(index);
  }

  // The piece as the host engine runs it.
  stream::CollectiveArgs hostArgs(size_t index) const {
    stream::CollectiveArgs h = args;
    h.count = count(index);
    switch (args.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kReduce:
      case CollectiveKind::kAllToAll:  // every block's range: in place, block j to rank j
        h.send = h.recv = slot(index);
        break;
      case CollectiveKind::kBroadcast:
        h.send = rank == args.root ? slot(index) : nullptr;
        h.recv = slot(index);
        break;
      case CollectiveKind::kReduceScatter:  // in place: recv is this rank's block of send
        h.send = slot(index);
        h.recv = ownBlock(index);
        break;
      case CollectiveKind::kAllGather:  // in place: send is this rank's block of recv
        h.send = ownBlock(index);
        h.recv = slot(index);
        break;
      case CollectiveKind::kPointToPoint:  // refused before staging (Communicator::submit)
        break;
    }
    return h;
  }
};

size_t DeviceStaging::copyIn(const Layout& call, size_t index, Stream stream) {
  const auto* send = static_cast<const uint8_t*>(call.args.send) + call.offsetBytes(index);
  const size_t bytes = call.bytes(index);
  switch (call.args.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduce:
      memory_->copy2D(call.slot(index), bytes, send, bytes, bytes, 1, stream);
      return bytes;
    case CollectiveKind::kBroadcast:
      if (call.rank != call.args.root)
        return 0;
      memory_->copy2D(call.slot(index), bytes, send, bytes, bytes, 1, stream);
      return bytes;
    case CollectiveKind::kReduceScatter:  // the range of every rank's block, gathered densely
    case CollectiveKind::kAllToAll:
      memory_->copy2D(call.slot(index), bytes, send, call.blockBytes(), bytes, call.blocks, stream);
      return bytes * call.blocks;
    case CollectiveKind::kAllGather:  // this rank's contribution into its block of the slot
      memory_->copy2D(call.ownBlock(index), bytes, send, bytes, bytes, 1, stream);
      return bytes;
    case CollectiveKind::kPointToPoint:
      break;
  }
  return 0;
}

size_t DeviceStaging::copyOut(const Layout& call, size_t index, Stream stream) {
  auto* recv = static_cast<uint8_t*>(call.args.recv) + call.offsetBytes(index);
  const size_t bytes = call.bytes(index);
  switch (call.args.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      memory_->copy2D(recv, bytes, call.slot(index), bytes, bytes, 1, stream);
      return bytes;
    case CollectiveKind::kReduce:  // the result exists on the root only
      if (call.rank != call.args.root)
        return 0;
      memory_->copy2D(recv, bytes, call.slot(index), bytes, bytes, 1, stream);
      return bytes;
    case CollectiveKind::kReduceScatter:  // this rank's reduced block
      memory_->copy2D(recv, bytes, call.ownBlock(index), bytes, bytes, 1, stream);
      return bytes;
    case CollectiveKind::kAllGather:  // the range of every block, scattered back
    case CollectiveKind::kAllToAll:
      memory_->copy2D(recv, call.blockBytes(), call.slot(index), bytes, bytes, call.blocks, stream);
      return bytes * call.blocks;
    case CollectiveKind::kPointToPoint:
      break;
  }
  return 0;
}

DeviceStaging::DeviceStaging(std::shared_ptr<codecs::DeviceMemory> memory,
                             int64_t slotBytes,
                             int64_t timeoutMs,
                             const std::atomic<bool>& abortFlag)
    : memory_(std::move(memory)),
      slotBytes_(slotBytes),
      timeoutMs_(timeoutMs),
      abortFlag_(abortFlag) {
  GS_CHECK(slotBytes_ > 0, Errc::kInvalidArgument, "staging slot size %lld must be positive",
           static_cast<long long>(slotBytes_));
}

DeviceStaging::~DeviceStaging() {
  // Copies may still read or write the slots: give them the timeout, then free regardless
  // (freeing pinned memory waits for the device itself).
  try {
    releaseEvents();
  } catch (const Error&) {
    // The communicator is going away; the free below still waits for the device.
  }
  for (auto*& s : slots_)
    memory_->freePinned(s);
  memory_->destroyStream(sideStream_);
}

void DeviceStaging::useDevice(int device) {
  if (eventsDevice_ == device)
    return;
  releaseEvents();
  try {
    for (auto** e : {&inputCopied_[0], &inputCopied_[1], &resultsCopied_})
      *e = memory_->createEvent();
  } catch (...) {
    destroyEvents();
    throw;
  }
  eventsDevice_ = device;
}

void DeviceStaging::releaseEvents() {
  if (eventsDevice_ < 0)
    return;
  // The last call's copies finish before the slots serve another device. When that wait fails
  // the communicator is broken (no further calls): the events go regardless.
  struct Destroy {
    DeviceStaging* self;
    ~Destroy() { self->destroyEvents(); }
  } destroy{this};
  waitFor(resultsCopied_, "the last call's result copies");
}

void DeviceStaging::destroyEvents() noexcept {
  for (auto** e : {&inputCopied_[0], &inputCopied_[1], &resultsCopied_}) {
    memory_->destroyEvent(*e);
    *e = nullptr;
  }
  eventsDevice_ = -1;
}

DeviceStaging::Stream DeviceStaging::sideStream(int device) {
  if (sideStreamDevice_ != device) {
    // useDevice() waited for the old device's last copies before it moved the events.
    memory_->destroyStream(sideStream_);
    sideStream_ = nullptr;
    sideStreamDevice_ = -1;
    sideStream_ = memory_->createStream();
    sideStreamDevice_ = device;
  }
  return sideStream_;
}

void DeviceStaging::applyResidual(const Layout& call, size_t index, stream::CollectiveArgs& piece) {
  const size_t rsize = codecs::residualElementSize(call.args.dtype);
  auto* share = static_cast<uint8_t*>(call.args.residual) + index * call.perPiece * rsize;
  codecs::applyResidual(call.args.dtype, call.slot(index), share, call.count(index));
  memset(share, 0, call.count(index) * rsize);
  piece.residual = share;
}

void DeviceStaging::reserveSlots(size_t bytes) {
  if (bytes <= slotCapacity_)
    return;
  // The previous call's result copies may still read the old slots.
  if (slotCapacity_ > 0)
    waitFor(resultsCopied_, "the previous call's result copies");
  for (auto*& s : slots_) {
    memory_->freePinned(s);
    s = nullptr;
  }
  slotCapacity_ = 0;
  // Whole MiB (a little room for the next, slightly larger call), at most the configured size
  // unless one element per block needs more.
  constexpr size_t kMiB = size_t{1} << 20;
  const size_t rounded =
      std::max(bytes, std::min((bytes + kMiB - 1) / kMiB * kMiB, static_cast<size_t>(slotBytes_)));
  for (auto*& s : slots_)
    s = static_cast<uint8_t*>(memory_->allocPinned(rounded));
  slotCapacity_ = rounded;
}

void waitForEvent(codecs::DeviceMemory& memory,
                  codecs::DeviceMemory::Event* event,
                  int64_t timeoutMs,
                  const std::atomic<bool>& abortFlag,
                  const char* what) {
  const Deadline deadline = Deadline::afterMs(timeoutMs);
  for (int round = 0;; ++round) {
    if (memory.done(event))
      return;
    GS_CHECK(!abortFlag.load(std::memory_order_relaxed), Errc::kAborted,
             "communicator aborted while waiting for %s on the CUDA stream", what);
    GS_CHECK(!deadline.expired(), Errc::kTimeout,
             "the CUDA stream did not complete %s within %lld ms (is earlier work on the "
             "stream still running, or blocked?)",
             what, static_cast<long long>(timeoutMs));
    if (round < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void DeviceStaging::waitFor(codecs::DeviceMemory::Event* event, const char* what) {
  waitForEvent(*memory_, event, timeoutMs_, abortFlag_, what);
}

DeviceStaging::Totals DeviceStaging::run(const stream::CollectiveArgs& args,
                                         int rank,
                                         int nranks,
                                         int device,
                                         Stream stream,
                                         const RunHost& runHost) {
  GS_CHECK(args.residual == nullptr || args.kind == CollectiveKind::kAllReduce,
           Errc::kInvalidArgument, "error feedback (a residual) is for allreduce only");
  GS_CHECK(args.kind != CollectiveKind::kAllToAll || args.layout == nullptr, Errc::kUnsupported,
           "alltoallv of CUDA device buffers is not supported yet (gs_alltoall is; or pass host "
           "buffers)");
  Totals totals;
  if (args.count == 0)
    return totals;
  CurrentDevice current(*memory_, device);
  const int streamDevice = memory_->streamDevice(stream);
  GS_CHECK(streamDevice == device, Errc::kInvalidArgument,
           "cuda_stream belongs to CUDA device %d but the buffers are on device %d", streamDevice,
           device);
  useDevice(device);
  const size_t esize = elementSize(args.dtype);
  const size_t blocks = isBlockwise(args.kind) ? static_cast<size_t>(nranks) : 1;
  const Layout call{args,
                    rank,
                    esize,
                    blocks,
                    std::max<size_t>(1, static_cast<size_t>(slotBytes_) / (esize * blocks)),
                    slots_};
  reserveSlots(call.bytes(0) * blocks);
  // The slots are free on the device's timeline once the last call's result copies ran.
  memory_->streamWait(stream, resultsCopied_);
  auto stageIn = [&](size_t index) {
    totals.toHostBytes += copyIn(call, index, stream);
    memory_->record(inputCopied_[index & 1], stream);
  };
  try {
    stageIn(0);
    for (size_t index = 0; index < call.pieces(); ++index) {
      if (index + 1 < call.pieces())
        stageIn(index + 1);  // into the other slot, after its previous result copy
      waitFor(inputCopied_[index & 1], "the input copy of a piece");
      stream::CollectiveArgs piece = call.hostArgs(index);
      if (args.residual != nullptr)
        applyResidual(call, index, piece);
      runHost(piece);
      totals.toDeviceBytes += copyOut(call, index, stream);
    }
  } catch (...) {
    // Input copies already enqueued may still write the slots: the next call (or the
    // destructor) orders itself after them.
    try {
      memory_->record(resultsCopied_, stream);
    } catch (const Error&) {
      // The stream is broken; the error being thrown says more.
    }
    throw;
  }
  memory_->record(resultsCopied_, stream);
  return totals;
}

DeviceStaging::Totals DeviceStaging::runIssued(const stream::CollectiveArgs& args,
                                               int rank,
                                               int nranks,
                                               const StreamMark& issued,
                                               const RunHost& runHost) {
  const int device = issued.device();
  CurrentDevice current(*memory_, device);
  useDevice(device);
  const Stream side = sideStream(device);
  memory_->streamWait(side, issued.event());
  const Totals totals = run(args, rank, nranks, device, side, runHost);
  waitFor(resultsCopied_, "the result copies");
  return totals;
}

void DeviceStaging::waitFor(const StreamMark& issued) {
  waitFor(issued.event(), "the work enqueued before the collective");
}

}  // namespace gs::control
