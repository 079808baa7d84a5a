#pragma once

#include <cstddef>

#include "common/types.h"

namespace gs::codecs {

/// Element-wise reduction kernels for every (dtype, op). 16-bit floats are reduced in fp32 and
/// rounded to nearest even once per call. kAvg reduces as a sum; finalizeAverage() divides.
/// All functions allow dst to alias a source exactly (in place); partial overlap is undefined.
/// Thread-safe (pure functions).

/// dst[i] = op(dst[i], src[i])
void reduceInPlace(DataType type, ReduceOp op, void* dst, const void* src, size_t count);
/// dst[i] = op(a[i], b[i])
void reduceInto(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t count);
/// data[i] = data[i] / nranks (integer types truncate toward zero). No-op unless op is kAvg.
void finalizeAverage(DataType type, ReduceOp op, void* data, size_t count, int nranks);

}  // namespace gs::codecs
