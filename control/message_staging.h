#pragma once

// Point-to-point messages on CUDA device buffers through pinned host staging.
//
// The engine sends from and receives into host memory, so a message whose buffer is device
// memory travels through a pinned host buffer of this pool:
// - a send: its bytes are copied device -> pinned on the communicator's own stream, after the
//   work the caller's stream held when the message was issued (a StreamMark: gs_send records it
//   at the call, gs_isend when the request is issued); the host waits for that copy (deadline:
//   the communicator's timeout, the abort flag honoured) before the engine sends from the
//   pinned buffer.
// - a receive: the engine receives into the pinned buffer; once the message is complete its
//   bytes are copied pinned -> device on the same stream (after the issue mark too: the
//   caller's earlier work on the buffer is done before it is overwritten) and the host waits
//   for that copy before the request completes. So gs_recv returns, and gs_irecv's request
//   completes, with the data in device memory: any stream may read it then. A receive that fails
//   (a count mismatch, a peer's failure) writes nothing to the device buffer.
//
// Buffers are reused across messages (a cudaHostAlloc costs milliseconds): one is taken when a
// message joins the engine's run and given back once it is complete (sizes rounded up to powers
// of two from 4 KiB); the pool keeps at most `poolBytes` between runs (trim: the communicator
// passes 2 x GS_STAGING_BYTES, the collectives' pinned budget; larger messages then pay a
// pinned allocation per run) and frees everything when destroyed.
//
// Not thread-safe: the communicator uses it under its exec mutex (one engine run at a time).

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "codecs/device_memory.h"
#include "control/device_staging.h"

namespace gs::control {

class MessageStaging {
 public:
  MessageStaging(std::shared_ptr<codecs::DeviceMemory> memory,
                 int64_t poolBytes,
                 int64_t timeoutMs,
                 const std::atomic<bool>& abortFlag);
  /// Waits (bounded by the timeout) for the last copy, then frees the pool, the event and the
  /// stream.
  ~MessageStaging();
  MessageStaging(const MessageStaging&) = delete;
  MessageStaging& operator=(const MessageStaging&) = delete;

  /// A pinned buffer of at least `bytes` (> 0): from the pool when one fits, else allocated.
  void* acquire(size_t bytes);
  /// Gives a buffer acquire() returned back to the pool (no copy may still use it).
  void release(void* p);
  /// Frees pooled buffers (least recently released first) until at most poolBytes stay
  /// pooled. Call it between engine runs: a released buffer may still be registered with a
  /// transport during one.
  void trim();

  /// Copies `bytes` device -> host (src device memory, dst pinned) or host -> device on the
  /// staging's own stream of the mark's device, after the mark, and waits for the copy. `what`
  /// names the message in errors ("the send of 4096 bytes to rank 1").
  void copy(void* dst, const void* src, size_t bytes, const StreamMark& issued, const char* what);
  /// Host buffers with a stream: waits until the caller's stream has passed the mark.
  void waitFor(const StreamMark& issued, const char* what);

  /// Pinned bytes held now (in use and pooled), and those pooled.
  size_t heldBytes() const { return heldBytes_; }
  size_t pooledBytes() const { return pooledBytes_; }

 private:
  struct Buffer {
    void* p;
    size_t bytes;
  };
  void waitFor(codecs::DeviceMemory::Event* event, const char* what, const char* waitingFor);
  /// The stream and event on `device` (made on first use, remade on another device).
  void useDevice(int device);
  void releaseDevice() noexcept;

  std::shared_ptr<codecs::DeviceMemory> memory_;
  size_t poolBytes_;
  int64_t timeoutMs_;
  const std::atomic<bool>& abortFlag_;
  std::vector<Buffer> pool_;   // free buffers
  std::vector<Buffer> inUse_;  // acquired, not yet released
  size_t heldBytes_ = 0;
  size_t pooledBytes_ = 0;
  codecs::DeviceMemory::Stream stream_ = nullptr;
  codecs::DeviceMemory::Event* copied_ = nullptr;  // after the last copy
  int device_ = -1;                                // stream_ and copied_'s; -1: none yet
};

}  // namespace gs::control
