// relativeError (codecs/codec.h): what the numerics guardrail of codec=auto samples.
#include <cmath>
#include <cstdint>

#include "codecs/codec.h"
#include "format/half.h"

namespace gs::codecs {
namespace {

double load(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DataType::kFloat16:
      return format::halfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16:
      return format::bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default:
      return 0;
  }
}

}  // namespace

double relativeError(DataType dtype, const void* x, const void* decoded, size_t count) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    const double a = load(dtype, x, i), b = load(dtype, decoded, i);
    // Non-finite values are the codecs' documented behaviour (poisoned blocks), not rounding
    // error: they say nothing about the precision budget.
    if (!std::isfinite(a) || !std::isfinite(b))
      continue;
    diff += (a - b) * (a - b);
    norm += a * a;
  }
  if (norm == 0)
    return diff == 0 ? 0 : 1;
  return std::sqrt(diff / norm);
}

}  // namespace gs::codecs
