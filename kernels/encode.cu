// Encode kernels of fp16, bf16, fp8e4m3, fp8e5m2, int8 and int4 for every float dtype.
#include "kernels/codec_kernels.cuh"
#include "kernels/detail.h"

namespace gs::kernels::detail {
namespace {

using dev::SrcLoader;

template <class D>
void encodeFor(const EncodeArgs& a, cudaStream_t stream) {
  const dev::EncodeParams p = dev::encodeParams(a, nullptr);
  const SrcLoader<D> ld{static_cast<const typename D::T*>(a.src), alignmentOf(a.src)};
  switch (a.codec) {
    case format::CodecId::kFp16:
      return dev::launchEncodeKernel<D, format::CodecId::kFp16>(p, ld, stream);
    case format::CodecId::kBf16:
      return dev::launchEncodeKernel<D, format::CodecId::kBf16>(p, ld, stream);
    case format::CodecId::kFp8E4M3:
      return dev::launchEncodeKernel<D, format::CodecId::kFp8E4M3>(p, ld, stream);
    case format::CodecId::kFp8E5M2:
      return dev::launchEncodeKernel<D, format::CodecId::kFp8E5M2>(p, ld, stream);
    case format::CodecId::kInt8:
      return dev::launchEncodeKernel<D, format::CodecId::kInt8>(p, ld, stream);
    case format::CodecId::kInt4:
      return dev::launchEncodeKernel<D, format::CodecId::kInt4>(p, ld, stream);
    default:
      GS_CHECK(false, Errc::kInternal, "encodeCodec: codec %d has no element kernel",
               static_cast<int>(a.codec));
  }
}

}  // namespace

void encodeCodec(const EncodeArgs& a, CUstream_st* stream) {
  switch (a.dtype) {
    case DataType::kFloat32:
      encodeFor<dev::F32>(a, stream);
      break;
    case DataType::kFloat64:
      encodeFor<dev::F64>(a, stream);
      break;
    case DataType::kFloat16:
      encodeFor<dev::F16>(a, stream);
      break;
    case DataType::kBFloat16:
      encodeFor<dev::BF16>(a, stream);
      break;
    default:
      GS_CHECK(false, Errc::kInvalidArgument, "codec %d cannot encode %s (use raw)",
               static_cast<int>(a.codec), dataTypeName(a.dtype));
  }
  GS_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gs::kernels::detail
