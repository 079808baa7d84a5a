#pragma once

// Codecs on device buffers: the CUDA kernels of kernels/ behind a plain C++ interface (no CUDA
// headers; the stream is struct CUstream_st*, ABI-identical to cudaStream_t).
//
// Same wire bytes as the CPU codecs (codec.h) and the same arithmetic (block_math.h), so for a
// given chunk a DeviceCodec and the CPU Codec of the same spec write identical bytes and decode
// to identical values (stochastic rounding included: same seed, same bits; NaN payloads aside,
// the GPU's arithmetic produces the canonical NaN).
//
// Ordering: every call only enqueues work on the caller's stream and returns; nothing waits
// for the device except takeError() (and the first use of a larger top-k, which allocates).
// Buffers must stay valid until the stream reaches the work.
//
// Errors: host-checkable problems (sizes, dtypes, arguments) return a reason / throw at once,
// as the CPU codecs do. Problems in the chunk's content (block size, scales, top-k indices)
// live in device memory: a validation kernel finds them before the decode kernels run, which
// then leave their outputs untouched; takeError() reports the first one.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "codecs/codec.h"

struct CUstream_st;

namespace gs::codecs {

/// Why device codecs cannot run here: "this build has no CUDA support" (GS_HAVE_CUDA 0), CUDA's
/// reason (no driver, no device), or nullptr when they can. Never throws.
const char* deviceUnavailableReason();

/// Where a buffer lives (cudaPointerGetAttributes). Always kHost without CUDA or a device.
enum class BufferLocation : uint8_t { kHost, kPinnedHost, kDevice, kManaged };
BufferLocation locateBuffer(const void* p);
const char* bufferLocationName(BufferLocation location);

/// Error-feedback outputs written in the encode pass: decoded (dtype) = decode(encode(x)),
/// residual (residualElementSize per element) = (x - decoded) * residualFactor.
struct DeviceFeedback {
  void* decoded = nullptr;
  void* residual = nullptr;
  double residualFactor = 1.0;
};

/// The device version of one codec spec. Holds device memory (a status word and top-k scratch)
/// on the device current at creation; use it with that device's streams. Not thread-safe: one
/// instance per thread (or per stream) that uses it.
class DeviceCodec {
 public:
  /// Throws gs::Error(kUnsupported) naming deviceUnavailableReason(), or kInvalidArgument for
  /// an invalid spec.
  static std::unique_ptr<DeviceCodec> create(const CodecSpec& spec);
  ~DeviceCodec();
  DeviceCodec(const DeviceCodec&) = delete;
  DeviceCodec& operator=(const DeviceCodec&) = delete;

  format::CodecId id() const { return spec_.id; }
  const CodecSpec& spec() const { return spec_; }
  bool supports(DataType dtype) const;
  /// The exact sizes encode() writes for count elements of dtype (host arithmetic, the CPU
  /// codec's sizes).
  static EncodedSize encodedSize(const CodecSpec& spec, DataType dtype, size_t count);
  EncodedSize encodedSize(DataType dtype, size_t count) const {
    return encodedSize(spec_, dtype, count);
  }

  /// Encodes count (< 2^32) device elements at src into out (device, maxEncodedBytes room).
  EncodedSize encode(DataType dtype,
                     const void* src,
                     size_t count,
                     uint8_t* out,
                     uint64_t seed,
                     CUstream_st* stream,
                     const DeviceFeedback& feedback = {});

  /// As Codec::decode / decodeReduce, for a chunk of any codec id (in.codec) in device memory
  /// and device buffers. Returns a static reason for a size mismatch (nothing enqueued).
  const char* decode(const EncodedChunk& in, void* dst, CUstream_st* stream);
  const char* decodeReduce(const EncodedChunk& in,
                           const Reduction& reduction,
                           void* dst,
                           CUstream_st* stream);

  /// Ring reduce-scatter hop: encodes op(operand, decode(in)) (rounded to dtype) with this
  /// codec into out, fused in one pass when the incoming chunk has this codec (else through
  /// scratch: count elements of dtype in device memory). out must not overlap the input.
  /// reduction.incomingFirst does not apply (a hop reduces the operand first). *written receives
  /// the encoded sizes. Returns a static reason for a size mismatch.
  const char* decodeReduceEncode(const EncodedChunk& in,
                                 const Reduction& reduction,
                                 uint8_t* out,
                                 uint64_t seed,
                                 void* scratch,
                                 CUstream_st* stream,
                                 EncodedSize* written,
                                 const DeviceFeedback& feedback = {});

  /// Waits for the stream and returns the first content error found in chunks decoded since the
  /// last call (the CPU decoder's wording), or nullptr; clears it.
  const char* takeError(CUstream_st* stream);

 private:
  struct State;
  DeviceCodec(const CodecSpec& spec, std::unique_ptr<State> state);
  CodecSpec spec_;
  std::unique_ptr<State> state_;
};

}  // namespace gs::codecs
