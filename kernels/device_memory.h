#pragma once

// The CUDA runtime calls behind codecs::DeviceMemory, as plain functions (no CUDA headers:
// streams and events are the ABI-identical struct CUstream_st* / CUevent_st*). kernels/ knows
// nothing of that interface: codecs/device_memory.cc adapts these calls to it, so the
// dependency runs one way (codecs -> kernels). Semantics are DeviceMemory's method for method.

#include <cstddef>

struct CUstream_st;
struct CUevent_st;

namespace gs::kernels {

/// The device holding p when it is device memory the host cannot read, else -1.
int pointerDevice(const void* p);
/// The device of a stream (null: the legacy default stream of the current device).
int streamDevice(CUstream_st* stream);
/// Makes `device` current on the calling thread; returns the device current before.
int swapCurrentDevice(int device);

/// A non-blocking stream of the current device. Throws gs::Error.
CUstream_st* createStream();
void destroyStream(CUstream_st* stream) noexcept;

/// Portable page-locked host memory. Throws gs::Error(kNoMemory) naming the size.
void* allocPinned(size_t bytes);
void freePinned(void* p) noexcept;

/// `rows` rows of `width` bytes, pitched on both sides, host or device memory either side;
/// enqueued on stream.
void copy2D(void* dst,
            size_t dstPitch,
            const void* src,
            size_t srcPitch,
            size_t width,
            size_t rows,
            CUstream_st* stream);

/// An event without timing, on the current device.
CUevent_st* createEvent();
void destroyEvent(CUevent_st* event) noexcept;
void recordEvent(CUevent_st* event, CUstream_st* stream);
/// Whether the stream passed the event; throws gs::Error on a failure in the work before it.
bool eventDone(CUevent_st* event);
/// Later work on stream waits (on the device) for the event.
void streamWaitEvent(CUstream_st* stream, CUevent_st* event);

}  // namespace gs::kernels
