#pragma once

// Device memory as the collectives' staging path sees it: where a buffer lives, pinned host
// memory, asynchronous copies and events on a caller's stream. A plain C++ interface (no CUDA
// headers; streams are struct CUstream_st*, ABI-identical to cudaStream_t): the CUDA runtime
// implements it (device_memory.cc over kernels/device_memory.h, GS_HAVE_CUDA builds), and tests
// drive the staging logic with a host fake where no GPU exists.
//
// Every copy and record only enqueues work on the given stream, ordered after what the caller
// enqueued there before; only done() looks at the device's progress (without waiting).

#include <cstddef>
#include <memory>
#include <string>

struct CUstream_st;

namespace gs::codecs {

class DeviceMemory {
 public:
  using Stream = CUstream_st*;
  /// An event: a marker recorded on a stream, done once the stream has passed it.
  struct Event;

  virtual ~DeviceMemory() = default;
  /// "cuda", or the fake's name in tests.
  virtual const char* name() const = 0;

  /// The device ordinal holding p when p is device memory the host cannot read, else -1 (host,
  /// pinned host and managed memory are host-readable).
  virtual int deviceOf(const void* p) = 0;
  /// The device a stream belongs to (null: the legacy default stream of the current device).
  virtual int streamDevice(Stream stream) = 0;
  /// Makes `device` current on the calling thread (copies and events then use it) and returns
  /// the device that was current before.
  virtual int setDevice(int device) = 0;

  /// A stream of the current device that does not wait for the legacy default stream (the
  /// library's own: copies of requests the progress thread runs). Throws gs::Error.
  virtual Stream createStream() = 0;
  virtual void destroyStream(Stream stream) noexcept = 0;

  /// Page-locked host memory the device copies to and from at full speed. Throws kNoMemory
  /// naming the size.
  virtual void* allocPinned(size_t bytes) = 0;
  virtual void freePinned(void* p) noexcept = 0;

  /// Copies `rows` rows of `width` bytes from src (rows srcPitch apart) to dst (rows dstPitch
  /// apart); either side may be host or device memory. Enqueued on stream.
  virtual void copy2D(void* dst,
                      size_t dstPitch,
                      const void* src,
                      size_t srcPitch,
                      size_t width,
                      size_t rows,
                      Stream stream) = 0;

  /// On the current device; record it only on that device's streams.
  virtual Event* createEvent() = 0;
  virtual void destroyEvent(Event* event) noexcept = 0;
  /// Marks the current end of stream's work.
  virtual void record(Event* event, Stream stream) = 0;
  /// Whether the stream passed the event (true for an event never recorded). Throws gs::Error
  /// when the device reports a failure in the work before it.
  virtual bool done(Event* event) = 0;
  /// Later work on stream waits (on the device, not the host) until the event is done.
  virtual void streamWait(Stream stream, Event* event) = 0;
};

/// The CUDA implementation. Throws gs::Error(kUnsupported) naming the reason where it cannot run
/// (a build without CUDA, no driver, no device).
std::unique_ptr<DeviceMemory> makeCudaDeviceMemory();

}  // namespace gs::codecs
