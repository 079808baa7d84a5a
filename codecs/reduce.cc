#include "codecs/reduce.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "format/half.h"

namespace gs::codecs {
namespace {

// Integer sums and products wrap around (two's complement), as in NCCL; computed unsigned so
// overflow is defined behaviour.
template <class T, bool = std::is_integral_v<T>>
struct WrapType {
  using type = T;
};
template <class T>
struct WrapType<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using Wrap = typename WrapType<T>::type;
struct Sum {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(static_cast<Wrap<T>>(a) + static_cast<Wrap<T>>(b));
  }
};
struct Prod {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(static_cast<Wrap<T>>(a) * static_cast<Wrap<T>>(b));
  }
};
// Min/Max propagate NaN from either side, like NCCL and torch.minimum/maximum.
struct Min {
  template <class T>
  static T apply(T a, T b) {
    if (a != a)
      return a;
    if (b != b)
      return b;
    return b < a ? b : a;
  }
};
struct Max {
  template <class T>
  static T apply(T a, T b) {
    if (a != a)
      return a;
    if (b != b)
      return b;
    return a < b ? b : a;
  }
};

// Storage type and the arithmetic type it is reduced in.
template <class Storage>
struct Native {
  using Compute = Storage;
  static Compute load(Storage v) { return v; }
  static Storage store(Compute v) { return v; }
};
struct Half {
  using Compute = float;
  static float load(uint16_t v) { return format::halfToFloat(v); }
  static uint16_t store(float v) { return format::floatToHalf(v); }
};
struct BFloat {
  using Compute = float;
  static float load(uint16_t v) { return format::bf16ToFloat(v); }
  static uint16_t store(float v) { return format::floatToBf16(v); }
};

template <class Storage, class Conv, class Op>
void reduceLoop(void* dst, const void* a, const void* b, size_t n) {
  auto* d = static_cast<Storage*>(dst);
  const auto* x = static_cast<const Storage*>(a);
  const auto* y = static_cast<const Storage*>(b);
  for (size_t i = 0; i < n; ++i)
    d[i] = Conv::store(Op::apply(Conv::load(x[i]), Conv::load(y[i])));
}

template <class Storage, class Conv>
void dispatchOp(ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return reduceLoop<Storage, Conv, Sum>(dst, a, b, n);
    case ReduceOp::kProd:
      return reduceLoop<Storage, Conv, Prod>(dst, a, b, n);
    case ReduceOp::kMin:
      return reduceLoop<Storage, Conv, Min>(dst, a, b, n);
    case ReduceOp::kMax:
      return reduceLoop<Storage, Conv, Max>(dst, a, b, n);
  }
}

template <class Storage, class Conv>
void divideLoop(void* data, size_t n, int nranks) {
  auto* d = static_cast<Storage*>(data);
  using C = typename Conv::Compute;
  // Integers divide in 64 bits: a narrow type cannot hold the rank count (uint8, 256 ranks).
  using Wide = std::conditional_t<std::is_integral_v<C>, int64_t, C>;
  const Wide divisor = static_cast<Wide>(nranks);
  for (size_t i = 0; i < n; ++i)
    d[i] = Conv::store(static_cast<C>(static_cast<Wide>(Conv::load(d[i])) / divisor));
}

}  // namespace

void reduceInto(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  switch (type) {
    case DataType::kFloat32:
      return dispatchOp<float, Native<float>>(op, dst, a, b, n);
    case DataType::kFloat64:
      return dispatchOp<double, Native<double>>(op, dst, a, b, n);
    case DataType::kFloat16:
      return dispatchOp<uint16_t, Half>(op, dst, a, b, n);
    case DataType::kBFloat16:
      return dispatchOp<uint16_t, BFloat>(op, dst, a, b, n);
    case DataType::kInt32:
      return dispatchOp<int32_t, Native<int32_t>>(op, dst, a, b, n);
    case DataType::kInt64:
      return dispatchOp<int64_t, Native<int64_t>>(op, dst, a, b, n);
    case DataType::kUInt8:
      return dispatchOp<uint8_t, Native<uint8_t>>(op, dst, a, b, n);
  }
}

void reduceInPlace(DataType type, ReduceOp op, void* dst, const void* src, size_t n) {
  reduceInto(type, op, dst, dst, src, n);
}

void finalizeAverage(DataType type, ReduceOp op, void* data, size_t n, int nranks) {
  if (op != ReduceOp::kAvg || nranks <= 1)
    return;
  switch (type) {
    case DataType::kFloat32:
      return divideLoop<float, Native<float>>(data, n, nranks);
    case DataType::kFloat64:
      return divideLoop<double, Native<double>>(data, n, nranks);
    case DataType::kFloat16:
      return divideLoop<uint16_t, Half>(data, n, nranks);
    case DataType::kBFloat16:
      return divideLoop<uint16_t, BFloat>(data, n, nranks);
    case DataType::kInt32:
      return divideLoop<int32_t, Native<int32_t>>(data, n, nranks);
    case DataType::kInt64:
      return divideLoop<int64_t, Native<int64_t>>(data, n, nranks);
    case DataType::kUInt8:
      return divideLoop<uint8_t, Native<uint8_t>>(data, n, nranks);
  }
}

}  // namespace gs::codecs
