// Fused ring reduce-scatter hop: decode an incoming chunk, reduce it with this rank's operand,
// round to the dtype, and encode the result with the same codec, in one pass (one tile pass for
// block codecs), optionally writing the error-feedback outputs.
#include "kernels/codec_kernels.cuh"
#include "kernels/detail.h"

namespace gs::kernels::detail {
namespace {

using format::CodecId;

template <class D, CodecId F>
void hopWith(const DecodeArgs& in, const EncodeArgs& out, uint64_t* status, cudaStream_t stream) {
  dev::HopLoader<D, F> ld{};
  ld.chunk.in = in.in;
  ld.chunk.inAlign = alignmentOf(in.in);
  ld.chunk.payload = in.in + in.metaBytes;
  ld.chunk.payloadAlign = alignmentOf(ld.chunk.payload);
  ld.operand = static_cast<const typename D::T*>(in.operand);
  ld.operandAlign = alignmentOf(in.operand);
  ld.op = in.op;
  const dev::EncodeParams p = dev::encodeParams(out, status);
  dev::launchEncodeKernel<D, F>(p, ld, stream);
}

template <class D>
void hopFor(const DecodeArgs& in, const EncodeArgs& out, uint64_t* status, cudaStream_t stream) {
  switch (out.codec) {
    case CodecId::kFp16:
      return hopWith<D, CodecId::kFp16>(in, out, status, stream);
    case CodecId::kBf16:
      return hopWith<D, CodecId::kBf16>(in, out, status, stream);
    case CodecId::kFp8E4M3:
      return hopWith<D, CodecId::kFp8E4M3>(in, out, status, stream);
    case CodecId::kFp8E5M2:
      return hopWith<D, CodecId::kFp8E5M2>(in, out, status, stream);
    case CodecId::kInt8:
      return hopWith<D, CodecId::kInt8>(in, out, status, stream);
    case CodecId::kInt4:
      return hopWith<D, CodecId::kInt4>(in, out, status, stream);
    default:
      GS_CHECK(false, Errc::kInternal, "hopFused: codec %d has no fused hop",
               static_cast<int>(out.codec));
  }
}

}  // namespace

void hopFused(const DecodeArgs& in, const EncodeArgs& out, uint64_t* status, CUstream_st* stream) {
  switch (in.dtype) {
    case DataType::kFloat32:
      hopFor<dev::F32>(in, out, status, stream);
      break;
    case DataType::kFloat64:
      hopFor<dev::F64>(in, out, status, stream);
      break;
    case DataType::kFloat16:
      hopFor<dev::F16>(in, out, status, stream);
      break;
    case DataType::kBFloat16:
      hopFor<dev::BF16>(in, out, status, stream);
      break;
    default:
      GS_CHECK(false, Errc::kInvalidArgument, "codec does not support %s", dataTypeName(in.dtype));
  }
  GS_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gs::kernels::detail
