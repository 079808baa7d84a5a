// Error-feedback bookkeeping (codecs/codec.h): residuals in float32 (float64 for float64).
#include <cstring>

#include "codecs/codec.h"
#include "format/half.h"

namespace gs::codecs {
namespace {

float load16(DataType t, uint16_t v) {
  return t == DataType::kFloat16 ? format::halfToFloat(v) : format::bf16ToFloat(v);
}
uint16_t store16(DataType t, float v) {
  return t == DataType::kFloat16 ? format::floatToHalf(v) : format::floatToBf16(v);
}

}  // namespace

size_t residualElementSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 4;
    case DataType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

void applyResidual(DataType dtype, void* x, const void* residual, size_t n) {
  switch (dtype) {
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(x);
      const auto* r = static_cast<const float*>(residual);
      for (size_t i = 0; i < n; ++i)
        p[i] += r[i];
      return;
    }
    case DataType::kFloat64: {
      auto* p = static_cast<double*>(x);
      const auto* r = static_cast<const double*>(residual);
      for (size_t i = 0; i < n; ++i)
        p[i] += r[i];
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(x);
      const auto* r = static_cast<const float*>(residual);
      for (size_t i = 0; i < n; ++i)
        p[i] = store16(dtype, load16(dtype, p[i]) + r[i]);
      return;
    }
    default:
      return;  // integer buffers carry no residual
  }
}

void updateResidual(
    DataType dtype, const void* xEncoded, const void* decoded, void* residual, size_t n) {
  switch (dtype) {
    case DataType::kFloat32: {
      const auto* x = static_cast<const float*>(xEncoded);
      const auto* d = static_cast<const float*>(decoded);
      auto* r = static_cast<float*>(residual);
      for (size_t i = 0; i < n; ++i)
        r[i] = x[i] - d[i];
      return;
    }
    case DataType::kFloat64: {
      const auto* x = static_cast<const double*>(xEncoded);
      const auto* d = static_cast<const double*>(decoded);
      auto* r = static_cast<double*>(residual);
      for (size_t i = 0; i < n; ++i)
        r[i] = x[i] - d[i];
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      const auto* x = static_cast<const uint16_t*>(xEncoded);
      const auto* d = static_cast<const uint16_t*>(decoded);
      auto* r = static_cast<float*>(residual);
      for (size_t i = 0; i < n; ++i)
        r[i] = load16(dtype, x[i]) - load16(dtype, d[i]);
      return;
    }
    default:
      return;
  }
}

}  // namespace gs::codecs
