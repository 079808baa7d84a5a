#pragma once

// Launchers of the CUDA codec kernels: a plain C++ header (no CUDA includes; the stream is the
// ABI-identical struct CUstream_st*). Reached only through codecs/device_codec.h.
//
// Every launcher only enqueues work on the given stream: no host synchronization, no
// allocation (the Workspace is sized beforehand), results ordered after earlier work on that
// stream. Wire layouts are exactly the CPU codecs' (codecs/codec.h), and the arithmetic is
// format/block_math.h's, so outputs are bit-identical to the CPU path (NaN payloads aside: GPU
// arithmetic on a NaN yields the canonical NaN where x86 keeps the operand's payload).
//
// Content errors of incoming chunks (bad block size, negative/infinite scale, int4 padding,
// top-k indices) are found by a validation kernel that runs first; it records the first error in
// the Workspace's sticky status word, and every later decode kernel of that Workspace leaves
// its outputs untouched while the status is set. Workspace::takeError() reads and clears it
// (that call waits for the stream).

#include <cstddef>
#include <cstdint>

#include "common/types.h"
#include "format/chunk_header.h"  // CodecId

struct CUstream_st;

namespace gs::kernels {

/// Why no CUDA device can be used, or nullptr when one can (cudaGetDeviceCount's error string,
/// "no CUDA device" for a count of zero). Never throws; safe on hosts without a driver.
const char* deviceUnavailableReason();

/// Where a pointer lives, from cudaPointerGetAttributes. kHost also covers memory CUDA does not
/// know (malloc'd) and every pointer when no device is usable.
enum class MemoryKind : uint8_t { kHost, kPinnedHost, kDevice, kManaged };
MemoryKind classifyPointer(const void* p);
const char* memoryKindName(MemoryKind kind);

/// Device memory the kernels need besides their arguments: the sticky status word, top-k's
/// histograms, per-tile counts and gathered values. Allocated on the current device by the
/// constructor and by reserve() (setup path: cudaMalloc, which may synchronize). Owned, move-only;
/// not thread-safe: one per thread/stream user.
class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(Workspace&& other) noexcept;
  Workspace& operator=(Workspace&& other) noexcept;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  /// Makes room for top-k over count elements keeping k (encode and decode). Cheap when the
  /// workspace is already large enough.
  void reserveTopk(uint64_t count, uint64_t k);
  /// Waits for `stream`, returns the first content error recorded since the last call (a static
  /// string, CPU codecs' wording) or nullptr, and clears it. Throws gs::Error on a CUDA error.
  const char* takeError(CUstream_st* stream);

  // For the launchers (device pointers).
  uint64_t* status() const { return status_; }
  uint8_t* topk() const { return topk_; }
  size_t topkBytes() const { return topkBytes_; }

 private:
  uint64_t* status_ = nullptr;
  uint8_t* topk_ = nullptr;
  size_t topkBytes_ = 0;
};

/// Bytes of top-k scratch needed for count elements keeping k (see Workspace::reserveTopk).
size_t topkWorkspaceBytes(uint64_t count, uint64_t k);

/// One encode. The sizes the codec writes are the CPU codec's (the caller computes them; see
/// codecs/device_codec.cc). Error feedback in the same pass: decodedOut (dtype) receives
/// decode(encode(x)) and residualOut (float32, float64 for float64) (x - decoded) * factor.
struct EncodeArgs {
  format::CodecId codec = format::CodecId::kRaw;
  DataType dtype = DataType::kFloat32;
  bool stochastic = false;
  uint32_t blockSize = 256;
  uint64_t topkK = 0;  // top-k: elements kept (codecs::topkKeep)
  const void* src = nullptr;
  size_t count = 0;
  uint8_t* out = nullptr;  // metadata then payload
  uint32_t srKey = 0;      // format::math::srKey(seed)
  void* decodedOut = nullptr;
  void* residualOut = nullptr;
  double residualFactor = 1.0;
};

/// One decode (reduce false: dst = decoded) or fused decode + reduce (dst = op(operand, decoded),
/// op(decoded, operand) when incomingFirst). operand may equal dst. metaBytes/payloadBytes must
/// have passed codecs::checkEncodedSizes.
struct DecodeArgs {
  format::CodecId codec = format::CodecId::kRaw;
  DataType dtype = DataType::kFloat32;
  bool reduce = false;
  ReduceOp op = ReduceOp::kSum;
  bool incomingFirst = false;
  const uint8_t* in = nullptr;
  uint32_t metaBytes = 0;
  uint32_t payloadBytes = 0;
  size_t count = 0;
  const void* operand = nullptr;
  void* dst = nullptr;
};

void launchEncode(const EncodeArgs& args, Workspace& ws, CUstream_st* stream);
void launchDecode(const DecodeArgs& args, Workspace& ws, CUstream_st* stream);

/// Ring reduce-scatter hop: values = op(operand, decode(in)) rounded to dtype, then encoded
/// with `out`'s codec into out.out, in one pass when in and out are the same block codec or
/// fp16/bf16, else through `scratch` (count elements of dtype, device memory). out.src is
/// ignored and in.dst unused; out.decodedOut / residualOut work as in encode (of the values). The
/// encoded output must not overlap the input chunk (the CPU engine re-encodes in the receive slot;
/// a device path encodes into a separate staging slot).
void launchDecodeReduceEncode(
    const DecodeArgs& in, const EncodeArgs& out, void* scratch, Workspace& ws, CUstream_st* stream);

/// Whether launchDecodeReduceEncode runs in one pass (no scratch needed) for these codecs.
bool hopIsFused(format::CodecId in, format::CodecId out);

}  // namespace gs::kernels
