#include "tools/support/dtype_elements.h"

#include <cstdint>

// Header-only scalar conversions: the library's own rounding, with no link to the library, so
// gradstream-perf still uses nothing of it but the C API.
#include "format/half.h"

namespace gs::support {

size_t dtypeSize(gs_dtype_t dtype) {
  switch (dtype) {
    case GS_FLOAT32:
    case GS_INT32:
      return 4;
    case GS_FLOAT16:
    case GS_BFLOAT16:
      return 2;
    case GS_FLOAT64:
    case GS_INT64:
      return 8;
    case GS_UINT8:
      return 1;
  }
  return 0;
}

double loadElement(const void* buf, gs_dtype_t dtype, size_t i) {
  switch (dtype) {
    case GS_FLOAT32:
      return static_cast<const float*>(buf)[i];
    case GS_FLOAT64:
      return static_cast<const double*>(buf)[i];
    case GS_FLOAT16:
      return format::halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case GS_BFLOAT16:
      return format::bf16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case GS_INT32:
      return static_cast<const int32_t*>(buf)[i];
    case GS_INT64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case GS_UINT8:
      return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

void storeElement(void* buf, gs_dtype_t dtype, size_t i, double v) {
  switch (dtype) {
    case GS_FLOAT32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case GS_FLOAT64:
      static_cast<double*>(buf)[i] = v;
      break;
    case GS_FLOAT16:
      static_cast<uint16_t*>(buf)[i] = format::floatToHalf(static_cast<float>(v));
      break;
    case GS_BFLOAT16:
      static_cast<uint16_t*>(buf)[i] = format::floatToBf16(static_cast<float>(v));
      break;
    case GS_INT32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case GS_INT64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case GS_UINT8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      break;
  }
}

}  // namespace gs::support
