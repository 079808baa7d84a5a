#pragma once

#include <cstddef>
#include <cstdint>

#include "gradstream/gradstream.h"
#include "tools/support/dtype_elements.h"

// Data patterns whose reductions are exact in every dtype (small integers), so -c can compare
// results bit for bit (averages with a tolerance).

using gs::support::dtypeSize;
using gs::support::loadElement;
using gs::support::storeElement;

/// Value rank `rank` contributes at element i.
double contribution(gs_redop_t op, int rank, size_t i);

/// Fills buf with rank's contributions.
void fillContribution(
    void* buf, gs_dtype_t dtype, gs_redop_t op, int rank, size_t count, size_t elementOffset);

/// Expected reduced value of element i over nranks ranks.
double expectedReduction(gs_dtype_t dtype, gs_redop_t op, int nranks, size_t i);

/// Number of elements of buf (count elements, first at global index elementOffset) that differ
/// from expected(i).
template <class Expected>
size_t countWrong(const void* buf,
                  gs_dtype_t dtype,
                  size_t count,
                  size_t elementOffset,
                  double tolerance,
                  Expected expected);

template <class Expected>
size_t countWrong(const void* buf,
                  gs_dtype_t dtype,
                  size_t count,
                  size_t elementOffset,
                  double tolerance,
                  Expected expected) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double got = loadElement(buf, dtype, i), want = expected(elementOffset + i);
    const double diff = got > want ? got - want : want - got;
    const double scale = want > 0 ? want : -want;
    if (!(diff <= tolerance * (scale > 1 ? scale : 1)))
      ++wrong;
  }
  return wrong;
}
