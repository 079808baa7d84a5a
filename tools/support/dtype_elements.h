#pragma once

// One element of a buffer of any gs_dtype_t, read and written as a double: how gradstream-perf
// (-c) and the C API tests fill contributions and check results without a template per dtype.

#include <cstddef>

#include "gradstream/gradstream.h"

namespace gs::support {

/// Bytes of one element of dtype; 0 for a value outside gs_dtype_t.
size_t dtypeSize(gs_dtype_t dtype);

/// Element i of buf, widened to double (fp16 and bf16 decoded as the library does).
double loadElement(const void* buf, gs_dtype_t dtype, size_t i);

/// Stores v as element i of buf: rounded to nearest-even for fp16 / bf16 (as the library's
/// codecs round), truncated by a plain conversion for the integer dtypes.
void storeElement(void* buf, gs_dtype_t dtype, size_t i, double v);

}  // namespace gs::support
