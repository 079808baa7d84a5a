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
  /// Waits (bounded by the timeout) for the last result copies, then frees the slots.
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  struct Totals {
    uint64_t toHostBytes = 0;
    uint64_t toDeviceBytes = 0;
  };
  /// Runs args (buffers on `device`, see collectiveDevice) for this rank of nranks. args.residual
  /// must be null (error feedback keeps host state). Throws what runHost throws, or kTimeout /
  /// kAborted / kSystem for the device; the slots stay safe for later calls either way.
  Totals run(const stream::CollectiveArgs& args,
             int rank,
             int nranks,
             int device,
             Stream stream,
             const RunHost& runHost);

  /// Host buffers with a stream: waits until the stream has finished the work enqueued on it so
  /// far (the caller's producers), bounded by the timeout.
  void synchronize(Stream stream);

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

  std::shared_ptr<codecs::DeviceMemory> memory_;
  int64_t slotBytes_;
  int64_t timeoutMs_;
  const std::atomic<bool>& abortFlag_;
  uint8_t* slots_[2] = {nullptr, nullptr};
  size_t slotCapacity_ = 0;
  codecs::DeviceMemory::Event* inputCopied_[2] = {nullptr, nullptr};
  codecs::DeviceMemory::Event* resultsCopied_ = nullptr;  // after the last call's result copies
  codecs::DeviceMemory::Event* synchronized_ = nullptr;   // synchronize()'s marker
  int eventsDevice_ = -1;  // device the events were created on; -1: none
};

}  // namespace gs::control
