#include "perf/check.h"

#include <cmath>

double contribution(gs_redop_t op, int rank, size_t i) {
  switch (op) {
    case GS_PROD:
      return ((i + static_cast<size_t>(rank)) % 5 == 0) ? 2.0 : 1.0;
    case GS_MIN:
    case GS_MAX:
      return static_cast<double>((i * 7 + static_cast<size_t>(rank) * 13) % 101);
    case GS_SUM:
    case GS_AVG:
      break;
  }
  return static_cast<double>((i % 7) + static_cast<size_t>(rank % 3));
}

void fillContribution(
    void* buf, gs_dtype_t dtype, gs_redop_t op, int rank, size_t count, size_t elementOffset) {
  for (size_t i = 0; i < count; ++i)
    storeElement(buf, dtype, i, contribution(op, rank, elementOffset + i));
}

double expectedReduction(gs_dtype_t dtype, gs_redop_t op, int nranks, size_t i) {
  double acc = contribution(op, 0, i);
  for (int r = 1; r < nranks; ++r) {
    const double v = contribution(op, r, i);
    switch (op) {
      case GS_SUM:
      case GS_AVG:
        acc += v;
        break;
      case GS_PROD:
        acc *= v;
        break;
      case GS_MIN:
        acc = v < acc ? v : acc;
        break;
      case GS_MAX:
        acc = v > acc ? v : acc;
        break;
    }
  }
  if (op == GS_AVG) {
    const bool integer = dtype == GS_INT32 || dtype == GS_INT64 || dtype == GS_UINT8;
    acc = integer ? std::trunc(acc / nranks) : acc / nranks;
  }
  if (dtype == GS_UINT8)
    acc = static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(acc)));
  return acc;
}
