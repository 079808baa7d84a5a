#pragma once

// Collectives on CUDA device buffers through pinned host staging.
//
// The engine reduces and encodes in host memory, so a device buffer travels in pieces: each
// piece is copied device -> pinned host slot on the caller's stream, reduced across the ranks by
// the host collective, and copied back pinned slot -> device on the same stream. Two slots
// alternate, so the input copy of piece k+1 and the result copy of piece k-1 run on the device
// while the network carries piece k. Every collective kind splits into pieces of the same kind:
// allreduce and broadcast by element ranges, reduce-scatter and allgather by the same range of
// every rank's block (strided copies gather them into one dense slot).
//
// Ordering: the input copies wait on the stream for the caller's earlier work; the host waits
// (deadline: the communicator's timeout, the abort flag honoured) only for those copies before
// it reduces a piece. The result copies are enqueued on the stream and the call returns without
// waiting for them: work the caller enqueues later on that stream sees the result, the host
// does not. A later call orders its first copy after them on its own stream (an event), so the
// slots are never overwritten early whichever stream it uses.
//
// Non-blocking calls (requests, gradient-stream buckets) run later on the progress thread, where
// the caller's stream has moved on: the call records a StreamMark on the caller's stream when it
// is issued, and the progress thread runs the copies on the staging's own stream after that
// mark (runIssued), returning once the results are in the device buffers.
//
// Error feedback (allreduce): the residual stays in host memory; each piece's share is added to
// the staged values in the slot and replaced by what this call's encodings lost.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "codecs/device_memory.h"
#include "stream/engine.h"

namespace gs::control {

/// The CUDA device holding the call's buffers (send or recv; the one both share), or -1 when
/// both are host-readable. Throws kInvalidArgument naming both when they are on two devices.
int collectiveDevice(codecs::DeviceMemory& memory, const stream::CollectiveArgs& args);

/// Waits on the host until the device has passed `event`: yields first, then sleeps in 20 us
/// steps (copies take a millisecond or so). kAborted once abortFlag is set, kTimeout after
/// timeoutMs; `what` names what the stream was to complete ("the work enqueued before the
/// collective").
void waitForEvent(codecs::DeviceMemory& memory,
                  codecs::DeviceMemory::Event* event,
                  int64_t timeoutMs,
                  const std::atomic<bool>& abortFlag,
                  const char* what);

/// Restores the caller's current CUDA device when it leaves scope (the library must not change
/// it): makes `device` current for the scope.
class CurrentDevice {
 public:
  CurrentDevice(codecs::DeviceMemory& memory, int device);
  ~CurrentDevice();
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  codecs::DeviceMemory& memory_;
  int previous_;
  int device_;
};

/// Where a caller's stream stood when a non-blocking call was issued: an event recorded there.
/// What the progress thread's copies (or, for host buffers, the host) wait for. Owns the event;
/// may be destroyed on any thread.
class StreamMark {
 public:
  /// Records on stream (null: the legacy default stream). bufferDevice: the call's device (see
  /// collectiveDevice) or -1; kInvalidArgument when the stream belongs to another one.
  StreamMark(std::shared_ptr<codecs::DeviceMemory> memory,
             codecs::DeviceMemory::Stream stream,
             int bufferDevice);
  ~StreamMark();
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;

  int device() const { return device_; }  // the stream's device
  codecs::DeviceMemory::Event* event() const { return event_; }

 private:
  std::shared_ptr<codecs::DeviceMemory> memory_;
  int device_;
  codecs::DeviceMemory::Event* event_ = nullptr;
};

class DeviceStaging {
 public:
  using Stream = codecs::DeviceMemory::Stream;
  /// Runs one piece: args with host buffers (the pinned slot), same kind, dtype, op and root.
  using RunHost = std::function<void(const stream::CollectiveArgs&)>;

  /// slotBytes: size of each of the two pinned slots (allocated on first use, no larger than a
  /// call needs). timeoutMs bounds every wait for the device.
  DeviceStaging(std::shared_ptr<codecs::DeviceMemory> memory,
                int64_t slotBytes,
                int64_t timeoutMs,
                const std::atomic<bool>& abortFlag);
  /// Waits (bounded by the timeout) for the last result copies, then frees the slots and the
  /// staging's own stream.
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  struct Totals {
    uint64_t toHostBytes = 0;
    uint64_t toDeviceBytes = 0;
  };
  /// Runs args (buffers on `device`, see collectiveDevice) for this rank of nranks, copies on
  /// stream. args.residual (allreduce only): host memory, one residual element per element,
  /// added to the staged input and replaced by what the call's encodings lost. Throws what
  /// runHost throws, or kTimeout / kAborted / kSystem for the device; the slots stay safe for
  /// later calls either way.
  Totals run(const stream::CollectiveArgs& args,
             int rank,
             int nranks,
             int device,
             Stream stream,
             const RunHost& runHost);

  /// As run(), for a call issued earlier (a non-blocking one): the copies go on the staging's
  /// own stream of the mark's device, after the work the caller's stream held when the call was
  /// issued; returns once the results are in the device buffers.
  Totals runIssued(const stream::CollectiveArgs& args,
                   int rank,
                   int nranks,
                   const StreamMark& issued,
                   const RunHost& runHost);

  /// Host buffers with a stream: waits (bounded by the timeout) until the caller's stream has
  /// done the work it held when the mark was made (at the call, or when a request was issued).
  void waitFor(const StreamMark& issued);

 private:
  struct Layout;
  /// Enqueue piece `index`'s input copy into slot index % 2 and its result copy out of it;
  /// return the bytes copied.
  size_t copyIn(const Layout& call, size_t index, Stream stream);
  size_t copyOut(const Layout& call, size_t index, Stream stream);
  void reserveSlots(size_t bytes);
  /// Events live on one device: (re)creates them when a call uses another one.
  void useDevice(int device);
  void releaseEvents();  // waits (bounded) for the last result copies, then destroys them
  void destroyEvents() noexcept;
  void waitFor(codecs::DeviceMemory::Event* event, const char* what);
  /// Adds the residual share of piece `index` to the staged values, clears it (the engine
  /// writes the new one) and points the piece's args at it.
  void applyResidual(const Layout& call, size_t index, stream::CollectiveArgs& piece);
  /// The staging's own stream on `device` (created on first use, replaced on another device).
  Stream sideStream(int device);

  std::shared_ptr<codecs::DeviceMemory> memory_;
  int64_t slotBytes_;
  int64_t timeoutMs_;
  const std::atomic<bool>& abortFlag_;
  uint8_t* slots_[2] = {nullptr, nullptr};
  size_t slotCapacity_ = 0;
  codecs::DeviceMemory::Event* inputCopied_[2] = {nullptr, nullptr};
  codecs::DeviceMemory::Event* resultsCopied_ = nullptr;  // after the last call's result copies
  int eventsDevice_ = -1;        // device the events were created on; -1: none
  Stream sideStream_ = nullptr;  // runIssued's copies; null until the first one
  int sideStreamDevice_ = -1;
};

}  // namespace gs::control
