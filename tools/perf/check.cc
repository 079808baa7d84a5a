#include "perf/check.h"

#include <cmath>
#include <cstring>

namespace {

uint16_t toHalf(float f) {
  // Exact for the small integers used here; round-to-nearest-even otherwise.
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x < 0x38800000u)
    return static_cast<uint16_t>(sign);  // tiny: not produced by -c data
  if (x >= 0x477ff000u)
    return static_cast<uint16_t>(sign | 0x7c00u);
  x += 0xc8000fffu + ((x >> 13) & 1u);
  return static_cast<uint16_t>(sign | (x >> 13));
}

float fromHalf(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t bits;
  if (e == 0)
    return (sign ? -1.f : 1.f) * static_cast<float>(m) * 5.9604644775390625e-8f;
  bits = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t toBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float fromBf16(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

}  // namespace

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
      return fromHalf(static_cast<const uint16_t*>(buf)[i]);
    case GS_BFLOAT16:
      return fromBf16(static_cast<const uint16_t*>(buf)[i]);
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
      static_cast<uint16_t*>(buf)[i] = toHalf(static_cast<float>(v));
      break;
    case GS_BFLOAT16:
      static_cast<uint16_t*>(buf)[i] = toBf16(static_cast<float>(v));
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
