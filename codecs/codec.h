#pragma once

// Codecs: how a chunk's elements are written on the wire. See codecs/README.md for the measured
// error bounds and throughput of each.
//
// Encoded layout (after the 64-byte ChunkHeader; metadata first, then payload):
//   codec     metaBytes                         payloadBytes          bytes/elem (block 256)
//   raw       0                                 count * sizeof(dtype)  sizeof(dtype)
//   fp16      0                                 2 * count              2
//   bf16      0                                 2 * count              2
//   fp8e4m3   4 + 4 * nblocks                   count                  ~1.016
//   fp8e5m2   4 + 4 * nblocks                   count                  ~1.016
//   int8      4 + 4 * nblocks                   count                  ~1.016
//   int4      4 + 4 * nblocks                   (count + 1) / 2        ~0.516
//   topk      4 * k (uint32 indices, strictly   4 * k (fp32 values)    8 * k / count
//             increasing, < count)
// Block codecs' metadata is a uint32 block size (8..65536) then one fp32 scale per block of
// nblocks = ceil(count / blockSize); the block size travels with the chunk, so a receiver needs
// nothing but the chunk to decode it. All fields little-endian.
//
// Rounding: round to nearest even by default; with the stochastic option (",sr") fp16, bf16,
// fp8 and int codecs round up with probability equal to the dropped fraction (unbiased), using
// random bits that depend only on (seed, element index).
//
// Non-finite inputs, handled deliberately:
//  - raw, fp16, bf16: element-wise; NaN stays NaN, +-Inf stays +-Inf, finite values beyond the
//    format's range become +-Inf (fp16 beyond 65504, as IEEE rounding does).
//  - fp8e4m3, fp8e5m2, int8, int4: a NaN or Inf anywhere in a block poisons that block: its scale
//    is written as NaN and every element of the block decodes to NaN (so a divergence is never
//    silently turned into finite numbers). Other blocks are unaffected. A block whose absmax is
//    below qmax * FLT_MIN (about 5e-36 for fp8/int8, 8e-38 for int4) encodes as zeros.
//  - topk: selects by |x| with NaN above +Inf above every finite value, so non-finite elements
//    are kept before any finite one and arrive as they were (a NaN as some NaN). Every NaN ranks
//    alike whatever its sign and payload (one key, format::math::topkKey): when more NaNs
//    compete than top-k keeps, the first ones in index order are kept, as for equal magnitudes,
//    on the CPU and the GPU alike.
//  - float64 sources are first rounded to float32 (values beyond float range become +-Inf, so a
//    block codec poisons their block).
//
// Integer dtypes use only raw. Lossy codecs take float32, float16, bfloat16 and float64 buffers;
// decodeReduce accumulates in float32 (float64 for float64 buffers) and rounds once to the dtype.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/types.h"
#include "format/chunk_header.h"  // format::CodecId

namespace gs::codecs {

const char* codecIdName(format::CodecId id);  // "raw", "fp16", ... ("unknown" otherwise)

/// A codec as users write it: "raw", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int4",
/// "topk:<fraction>" (0 < fraction <= 1), with comma-separated options ",sr" (stochastic
/// rounding; not for raw or topk) and ",block=N" (block codecs, 8 <= N <= 65536).
struct CodecSpec {
  format::CodecId id = format::CodecId::kRaw;
  bool stochastic = false;
  uint32_t blockSize = 256;
  float topkFraction = 0.01f;

  /// Throws gs::Error(kInvalidArgument) naming the unknown codec or bad option.
  static CodecSpec parse(const std::string& text);
  /// Canonical text that parse() maps back to this spec ("int4,sr,block=128", "topk:0.01").
  std::string name() const;
};

struct EncodedSize {
  uint32_t metaBytes;
  uint32_t payloadBytes;
};

/// One chunk's encoded elements as they lie in memory, what follows its ChunkHeader: count
/// elements of dtype, written by codec `codec` as metaBytes of metadata then payloadBytes of
/// encoded elements at `bytes` (metaBytes + payloadBytes readable). Comes from the wire, so
/// every decoder validates it before use.
struct EncodedChunk {
  uint8_t codec = 0;  // the header's codec byte: DeviceCodec decodes by it; callers pick the
                      // CPU Codec by it (a Codec decodes as its own id())
  DataType dtype = DataType::kFloat32;
  size_t count = 0;
  const uint8_t* bytes = nullptr;
  uint32_t metaBytes = 0;
  uint32_t payloadBytes = 0;
};

/// How decodeReduce combines decoded values with an operand: dst[i] = op(operand[i],
/// decoded[i]), or op(decoded[i], operand[i]) when incomingFirst (it matters only for which NaN
/// min/max return). operand may equal dst. kAvg reduces as a sum (the caller divides at the
/// end, as for raw).
struct Reduction {
  ReduceOp op = ReduceOp::kSum;
  const void* operand = nullptr;
  bool incomingFirst = false;
};

/// Encodes and decodes chunks of one codec. Stateless and thread-safe: one instance per spec is
/// shared by every thread. Decoding depends only on the bytes (block size, k travel in them), so
/// any instance of a codec id decodes what any other instance of that id encoded.
class Codec {
 public:
  virtual ~Codec() = default;
  virtual format::CodecId id() const = 0;
  /// Upper bound of metaBytes + payloadBytes for count elements of dtype; never more than
  /// count * elementSize(dtype) + 4096 for a dtype the codec supports.
  virtual size_t maxEncodedBytes(DataType dtype, size_t count) const = 0;
  /// Whether this codec can encode elements of dtype.
  virtual bool supports(DataType dtype) const = 0;
  /// Encodes count (< 2^32) elements at src into out (metadata then payload; out holds at least
  /// maxEncodedBytes). seed feeds stochastic rounding: same seed, same bits. dtype must be
  /// supported. No allocation.
  virtual EncodedSize encode(
      DataType dtype, const void* src, size_t count, uint8_t* out, uint64_t seed) const = 0;
  /// Validates the chunk's sizes against its count and the metadata's content; returns a static
  /// reason on failure (dst untouched), nullptr after writing dst[i] = decoded[i].
  virtual const char* decode(const EncodedChunk& in, void* dst) const = 0;
  /// As decode, then reduces into dst as `reduction` says.
  virtual const char* decodeReduce(const EncodedChunk& in,
                                   const Reduction& reduction,
                                   void* dst) const = 0;
};

/// The codec for a spec. Throws gs::Error(kInvalidArgument) for an invalid spec.
std::unique_ptr<Codec> makeCodec(const CodecSpec& spec);

/// Checks that metaBytes/payloadBytes can be an encoding of count elements of dtype by codec
/// `codec` (a raw byte from the wire): known codec, dtype supported, exact sizes for the
/// element-wise layouts, consistent shapes otherwise, and at most count * elementSize + 4096 in
/// all. Returns nullptr or a static reason. The decoders check this and the metadata's content.
const char* checkEncodedSizes(
    uint8_t codec, DataType dtype, uint64_t count, uint32_t metaBytes, uint32_t payloadBytes);

// ---- error feedback --------------------------------------------------------------------------
// The residual of a buffer is kept in float32 for float32/float16/bfloat16 buffers and float64
// for float64 buffers (residualElementSize bytes per element). One iteration:
//   applyResidual(dtype, x, r, n);            x += r (rounded once into dtype)
//   encode(x) -> chunk; decode(chunk) -> d;   (d: the decoded values, same dtype as x)
//   updateResidual(dtype, x, d, r, n);        r = x - d
// so what a lossy codec dropped in one iteration is sent in a later one.

size_t residualElementSize(DataType dtype);  // 4, or 8 for float64; 0 for integer dtypes
void applyResidual(DataType dtype, void* x, const void* residual, size_t count);
void updateResidual(
    DataType dtype, const void* xEncoded, const void* decoded, void* residual, size_t count);

/// Relative L2 error ||x - decoded|| / ||x|| of count elements of a floating-point dtype
/// (finite elements only; 0 when both are all zero, 1 when only x is). For the sampled error of
/// lossy chunks (codec=auto's guardrail).
double relativeError(DataType dtype, const void* x, const void* decoded, size_t count);

}  // namespace gs::codecs
