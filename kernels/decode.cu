// Decode and fused decode + reduce of fp16, bf16, fp8e4m3, fp8e5m2, int8 and int4 chunks into
// every float dtype, the validation of block codecs' metadata, and raw reductions (every dtype).
#include "kernels/codec_kernels.cuh"
#include "kernels/detail.h"

namespace gs::kernels {
namespace dev {

struct DecodeParams {
  InChunk chunk;
  uint64_t count;
  bool reduce;
  ReduceOp op;
  bool first;
  const void* operand;
  uint32_t operandAlign;
  void* dst;
  uint32_t dstAlign;
  const uint64_t* status;
};

template <class D, CodecId F>
__global__ void __launch_bounds__(kThreads) decodeKernel(DecodeParams p) {
  using T = typename D::T;
  using C = typename D::C;
  if (statusFailed(p.status))
    return;
  const uint32_t block =
      (F == CodecId::kFp16 || F == CodecId::kBf16) ? 0 : loadU32(p.chunk.in, p.chunk.inAlign);
  const uint64_t groups = groupsOf(p.count);
  for (uint64_t g = firstGroup(); g < groups; g += groupStride()) {
    const uint64_t i0 = g * kGroup;
    const int valid = p.count - i0 < kGroup ? static_cast<int>(p.count - i0) : kGroup;
    float v[kGroup];
    decodeGroup<F>(p.chunk, block, g, valid, v);
    T out[kGroup];
    if (!p.reduce) {
#pragma unroll
      for (int k = 0; k < static_cast<int>(kGroup); ++k)
        out[k] = D::store(static_cast<C>(v[k]));
    } else {
      T a[kGroup];
      loadGroupRw(static_cast<const T*>(p.operand) + i0, p.operandAlign, valid, a);
#pragma unroll
      for (int k = 0; k < static_cast<int>(kGroup); ++k) {
        const C x = D::load(a[k]);
        const C y = static_cast<C>(v[k]);
        out[k] = D::store(p.first ? applyOp<C>(p.op, y, x) : applyOp<C>(p.op, x, y));
      }
    }
    storeGroup(static_cast<T*>(p.dst) + i0, p.dstAlign, valid, out);
  }
}

/// Checks a block codec's metadata as the CPU decoder does (block size, metadata size, every
/// scale non-negative and not infinite, int4 padding nibble) and records the first failure.
template <CodecId F>
__global__ void __launch_bounds__(kThreads) validateBlockKernel(const uint8_t* in,
                                                                uint32_t inAlign,
                                                                uint32_t metaBytes,
                                                                uint32_t payloadBytes,
                                                                uint64_t count,
                                                                uint64_t* status) {
  const uint32_t block = loadU32(in, inAlign);
  const bool blockOk = block >= 8 && block <= 65536 && block % 8 == 0;
  const uint64_t nblocks = blockOk ? (count + block - 1) / block : 0;
  const bool metaOk = blockOk && metaBytes == 4 + 4 * nblocks;
  const uint64_t tid = firstGroup();
  if (tid == 0) {
    if (!blockOk)
      recordError(status, kErrBlockSize, 0);
    else if (!metaOk)
      recordError(status, kErrMetaSize, 0);
    if (F == CodecId::kInt4 && (count & 1) && (in[metaBytes + payloadBytes - 1] & 0xf0) != 0)
      recordError(status, kErrInt4Padding, 0);
  }
  if (!metaOk)
    return;
  for (uint64_t b = tid; b < nblocks; b += groupStride()) {
    const uint32_t s = loadU32(in + 4 + 4 * b, inAlign);
    if (s & 0x80000000u)
      recordError(status, kErrScale, 2 * b);
    else if (s == 0x7f800000u)
      recordError(status, kErrScale, 2 * b + 1);
  }
}

/// Raw reduction: dst = op(a, b) with the CPU's reduce.cc semantics for every dtype. a or b may
/// equal dst.
template <class D, bool kInt>
__global__ void __launch_bounds__(kThreads) rawReduceKernel(const typename D::T* a,
                                                            uint32_t aAlign,
                                                            const typename D::T* b,
                                                            uint32_t bAlign,
                                                            typename D::T* dst,
                                                            uint32_t dstAlign,
                                                            uint64_t count,
                                                            ReduceOp op) {
  using T = typename D::T;
  using C = typename D::C;
  const uint64_t groups = groupsOf(count);
  for (uint64_t g = firstGroup(); g < groups; g += groupStride()) {
    const uint64_t i0 = g * kGroup;
    const int valid = count - i0 < kGroup ? static_cast<int>(count - i0) : kGroup;
    T x[kGroup], y[kGroup], out[kGroup];
    loadGroupRw(a + i0, aAlign, valid, x);
    loadGroupRw(b + i0, bAlign, valid, y);
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k) {
      if constexpr (kInt) {
        using U = std::make_unsigned_t<T>;
        out[k] = applyIntOp<T, U>(op, x[k], y[k]);
      } else {
        out[k] = D::store(applyOp<C>(op, D::rawLoad(x[k]), D::rawLoad(y[k])));
      }
    }
    storeGroup(dst + i0, dstAlign, valid, out);
  }
}

}  // namespace dev

namespace detail {
namespace {

using format::CodecId;

template <class D, CodecId F>
void decodeWith(const dev::DecodeParams& p, cudaStream_t stream) {
  const uint32_t blocks = dev::blocksFor(groupsOf(p.count), kThreads);
  if (blocks > 0)
    dev::decodeKernel<D, F><<<blocks, kThreads, 0, stream>>>(p);
}

template <class D>
void decodeFor(CodecId codec, const dev::DecodeParams& p, cudaStream_t stream) {
  switch (codec) {
    case CodecId::kFp16:
      return decodeWith<D, CodecId::kFp16>(p, stream);
    case CodecId::kBf16:
      return decodeWith<D, CodecId::kBf16>(p, stream);
    case CodecId::kFp8E4M3:
      return decodeWith<D, CodecId::kFp8E4M3>(p, stream);
    case CodecId::kFp8E5M2:
      return decodeWith<D, CodecId::kFp8E5M2>(p, stream);
    case CodecId::kInt8:
      return decodeWith<D, CodecId::kInt8>(p, stream);
    case CodecId::kInt4:
      return decodeWith<D, CodecId::kInt4>(p, stream);
    default:
      GS_CHECK(false, Errc::kInternal, "decodeCodec: codec %d has no element kernel",
               static_cast<int>(codec));
  }
}

template <CodecId F>
void validateWith(const DecodeArgs& a, uint64_t* status, cudaStream_t stream) {
  const uint64_t scales = a.metaBytes >= 4 ? (a.metaBytes - 4) / 4 : 0;
  const uint32_t blocks = dev::blocksFor(scales > 0 ? scales : 1, kThreads);
  dev::validateBlockKernel<F><<<blocks, kThreads, 0, stream>>>(a.in, alignmentOf(a.in), a.metaBytes,
                                                               a.payloadBytes, a.count, status);
}

template <class D, bool kInt>
void rawWith(const DecodeArgs& a, cudaStream_t stream) {
  using T = typename D::T;
  const auto* in = reinterpret_cast<const T*>(a.in);
  const auto* opnd = static_cast<const T*>(a.operand);
  const T* x = a.incomingFirst ? in : opnd;
  const T* y = a.incomingFirst ? opnd : in;
  const uint32_t blocks = dev::blocksFor(groupsOf(a.count), kThreads);
  if (blocks > 0) {
    dev::rawReduceKernel<D, kInt><<<blocks, kThreads, 0, stream>>>(
        x, alignmentOf(x), y, alignmentOf(y), static_cast<T*>(a.dst), alignmentOf(a.dst), a.count,
        a.op);
  }
}

}  // namespace

void validateChunk(const DecodeArgs& a, uint64_t* status, CUstream_st* stream) {
  switch (a.codec) {
    case CodecId::kFp8E4M3:
      return validateWith<CodecId::kFp8E4M3>(a, status, stream);
    case CodecId::kFp8E5M2:
      return validateWith<CodecId::kFp8E5M2>(a, status, stream);
    case CodecId::kInt8:
      return validateWith<CodecId::kInt8>(a, status, stream);
    case CodecId::kInt4:
      return validateWith<CodecId::kInt4>(a, status, stream);
    default:
      return;  // fp16/bf16 carry no metadata
  }
}

void decodeCodec(const DecodeArgs& a, uint64_t* status, CUstream_st* stream) {
  if (a.count == 0)
    return;
  validateChunk(a, status, stream);
  dev::DecodeParams p{};
  p.chunk.in = a.in;
  p.chunk.inAlign = alignmentOf(a.in);
  p.chunk.payload = a.in + a.metaBytes;
  p.chunk.payloadAlign = alignmentOf(p.chunk.payload);
  p.count = a.count;
  p.reduce = a.reduce;
  p.op = a.op;
  p.first = a.incomingFirst;
  p.operand = a.operand;
  p.operandAlign = alignmentOf(a.operand);
  p.dst = a.dst;
  p.dstAlign = alignmentOf(a.dst);
  p.status = status;
  switch (a.dtype) {
    case DataType::kFloat32:
      decodeFor<dev::F32>(a.codec, p, stream);
      break;
    case DataType::kFloat64:
      decodeFor<dev::F64>(a.codec, p, stream);
      break;
    case DataType::kFloat16:
      decodeFor<dev::F16>(a.codec, p, stream);
      break;
    case DataType::kBFloat16:
      decodeFor<dev::BF16>(a.codec, p, stream);
      break;
    default:
      GS_CHECK(false, Errc::kInvalidArgument, "codec does not support %s", dataTypeName(a.dtype));
  }
  GS_CHECK_CUDA(cudaGetLastError());
}

void rawReduce(const DecodeArgs& a, CUstream_st* stream) {
  switch (a.dtype) {
    case DataType::kFloat32:
      rawWith<dev::F32, false>(a, stream);
      break;
    case DataType::kFloat64:
      rawWith<dev::F64, false>(a, stream);
      break;
    case DataType::kFloat16:
      rawWith<dev::F16, false>(a, stream);
      break;
    case DataType::kBFloat16:
      rawWith<dev::BF16, false>(a, stream);
      break;
    case DataType::kInt32:
      rawWith<dev::I32, true>(a, stream);
      break;
    case DataType::kInt64:
      rawWith<dev::I64, true>(a, stream);
      break;
    case DataType::kUInt8:
      rawWith<dev::U8, true>(a, stream);
      break;
  }
  GS_CHECK_CUDA(cudaGetLastError());
}

}  // namespace detail
}  // namespace gs::kernels
