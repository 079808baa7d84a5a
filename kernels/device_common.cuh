#pragma once

// Device-side building blocks of the codec kernels: dtype traits (the same load/store
// conversions as the CPU loops), the reduction ops, and group (8-element) loads and stores that
// use 16-byte accesses where the alignment allows. Private to kernels/.

#include <cstdint>

#include <cuda_runtime.h>

#include "common/types.h"
#include "format/block_math.h"
#include "format/half.h"
#include "kernels/launch_config.h"

namespace gs::kernels::dev {

namespace math = ::gs::format::math;
using ::gs::format::bf16ToFloat;
using ::gs::format::bitsFloat;
using ::gs::format::floatBits;
using ::gs::format::floatToBf16;
using ::gs::format::floatToHalf;
using ::gs::format::halfToFloat;

// ---- dtypes: storage T, arithmetic C, residual R ----------------------------------------------
// load/store: the codecs' conversions (cpu_loops.inc DF*); rawLoad: codecs/reduce.cc's;
// resLoad: codecs/error_feedback.cc's.
// float and double: stored, computed and kept as residuals in their own type.
template <class V>
struct NativeFloat {
  using T = V;
  using C = V;
  using R = V;
  static __device__ __forceinline__ C load(T v) { return v; }
  static __device__ __forceinline__ T store(C v) { return v; }
  static __device__ __forceinline__ C rawLoad(T v) { return v; }
  static __device__ __forceinline__ R resLoad(T v) { return v; }
};
using F32 = NativeFloat<float>;
using F64 = NativeFloat<double>;
struct F16 {
  using T = uint16_t;
  using C = float;
  using R = float;
  static __device__ __forceinline__ C load(T v) { return math::halfBitsToFloat(v); }
  static __device__ __forceinline__ T store(C v) { return floatToHalf(v); }
  static __device__ __forceinline__ C rawLoad(T v) { return halfToFloat(v); }
  static __device__ __forceinline__ R resLoad(T v) { return halfToFloat(v); }
};
struct BF16 {
  using T = uint16_t;
  using C = float;
  using R = float;
  static __device__ __forceinline__ C load(T v) { return bf16ToFloat(v); }
  static __device__ __forceinline__ T store(C v) { return floatToBf16(v); }
  static __device__ __forceinline__ C rawLoad(T v) { return bf16ToFloat(v); }
  static __device__ __forceinline__ R resLoad(T v) { return bf16ToFloat(v); }
};
// Integer dtypes (raw only): sums and products wrap around, computed unsigned.
template <class I, class U>
struct Int {
  using T = I;
  using C = I;
  static __device__ __forceinline__ C rawLoad(T v) { return v; }
};
using I32 = Int<int32_t, uint32_t>;
using I64 = Int<int64_t, uint64_t>;
using U8 = Int<uint8_t, uint8_t>;

// ---- reductions (runtime op: uniform across the grid, so the branch costs nothing) ------------
template <class C>
__device__ __forceinline__ C applyOp(ReduceOp op, C a, C b) {
  switch (op) {
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      return math::minPropagateNan(a, b);
    case ReduceOp::kMax:
      return math::maxPropagateNan(a, b);
    default:  // kSum, kAvg (divided at the end)
      return a + b;
  }
}
template <class I, class U>
__device__ __forceinline__ I applyIntOp(ReduceOp op, I a, I b) {
  switch (op) {
    case ReduceOp::kProd:
      return static_cast<I>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    case ReduceOp::kMin:
      return b < a ? b : a;
    case ReduceOp::kMax:
      return a < b ? b : a;
    default:
      return static_cast<I>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
}

// ---- group access -----------------------------------------------------------------------------
// A group is kGroup consecutive elements starting at a multiple of kGroup. `align` is the
// alignment of the array's base (alignmentOf), the same for every group.
//
// Buffers may start at any byte (a float32 destination at an odd address is valid, as on the
// CPU path): below sizeof(T) every element is moved a byte at a time. An access through a T*
// that is not T-aligned faults on the GPU (cudaErrorMisalignedAddress, which also kills the
// context), unlike on x86.

/// One element at p, whose array base is aligned to `align` bytes.
template <class T>
__device__ __forceinline__ T loadElem(const T* p, uint32_t align) {
  if (align >= sizeof(T))
    return *p;
  const uint8_t* q = reinterpret_cast<const uint8_t*>(p);
  uint8_t b[sizeof(T)];
#pragma unroll
  for (uint32_t j = 0; j < sizeof(T); ++j)
    b[j] = q[j];
  T v;
  memcpy(&v, b, sizeof(T));
  return v;
}
template <class T>
__device__ __forceinline__ void storeElem(T* p, uint32_t align, T v) {
  if (align >= sizeof(T)) {
    *p = v;
    return;
  }
  uint8_t b[sizeof(T)];
  memcpy(b, &v, sizeof(T));
  uint8_t* q = reinterpret_cast<uint8_t*>(p);
#pragma unroll
  for (uint32_t j = 0; j < sizeof(T); ++j)
    q[j] = b[j];
}

template <class T>
__device__ __forceinline__ void loadGroup(const T* p, uint32_t align, int valid, T (&v)[kGroup]) {
  constexpr uint32_t kBytes = sizeof(T) * kGroup;
  if (valid == static_cast<int>(kGroup) && kBytes >= 16 && align >= 16) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
    uint4 w[kBytes / 16 > 0 ? kBytes / 16 : 1];
#pragma unroll
    for (uint32_t j = 0; j < kBytes / 16; ++j)
      w[j] = __ldg(q + j);
    memcpy(v, w, kBytes);
  } else if (valid == static_cast<int>(kGroup) && kBytes == 8 && align >= 8) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
    memcpy(v, &w, 8);
  } else {
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k)
      v[k] = k < valid ? loadElem(p + k, align) : T(0);
  }
}

/// Plain (non-__ldg) load: for operands that may alias the destination of the same kernel.
template <class T>
__device__ __forceinline__ void loadGroupRw(const T* p, uint32_t align, int valid, T (&v)[kGroup]) {
  constexpr uint32_t kBytes = sizeof(T) * kGroup;
  if (valid == static_cast<int>(kGroup) && kBytes >= 16 && align >= 16) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
    uint4 w[kBytes / 16 > 0 ? kBytes / 16 : 1];
#pragma unroll
    for (uint32_t j = 0; j < kBytes / 16; ++j)
      w[j] = q[j];
    memcpy(v, w, kBytes);
  } else if (valid == static_cast<int>(kGroup) && kBytes == 8 && align >= 8) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    memcpy(v, &w, 8);
  } else {
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k)
      v[k] = k < valid ? loadElem(p + k, align) : T(0);
  }
}

template <class T>
__device__ __forceinline__ void storeGroup(T* p, uint32_t align, int valid, const T (&v)[kGroup]) {
  constexpr uint32_t kBytes = sizeof(T) * kGroup;
  if (valid == static_cast<int>(kGroup) && kBytes >= 16 && align >= 16) {
    uint4 w[kBytes / 16 > 0 ? kBytes / 16 : 1];
    memcpy(w, v, kBytes);
    uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (uint32_t j = 0; j < kBytes / 16; ++j)
      q[j] = w[j];
  } else if (valid == static_cast<int>(kGroup) && kBytes == 8 && align >= 8) {
    uint2 w;
    memcpy(&w, v, 8);
    *reinterpret_cast<uint2*>(p) = w;
  } else {
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k) {
      if (k < valid)
        storeElem(p + k, align, v[k]);
    }
  }
}

/// Stores n (4, 8 or 16) bytes at p, whose alignment is min(base alignment, n); only the first
/// `valid` bytes when valid < n.
template <int N>
__device__ __forceinline__ void storeBytes(uint8_t* p,
                                           uint32_t baseAlign,
                                           int valid,
                                           const uint8_t (&b)[N]) {
  const uint32_t a = baseAlign < N ? baseAlign : N;
  if (valid == N && a >= 16 && N == 16) {
    uint4 w;
    memcpy(&w, b, 16);
    *reinterpret_cast<uint4*>(p) = w;
  } else if (valid == N && a >= 8 && N % 8 == 0) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      uint2 w;
      memcpy(&w, b + 8 * j, 8);
      reinterpret_cast<uint2*>(p)[j] = w;
    }
  } else if (valid == N && a >= 4) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      uint32_t w;
      memcpy(&w, b + 4 * j, 4);
      reinterpret_cast<uint32_t*>(p)[j] = w;
    }
  } else {
    for (int j = 0; j < valid; ++j)
      p[j] = b[j];
  }
}

template <int N>
__device__ __forceinline__ void loadBytes(const uint8_t* p,
                                          uint32_t baseAlign,
                                          int valid,
                                          uint8_t (&b)[N]) {
  const uint32_t a = baseAlign < N ? baseAlign : N;
  if (valid == N && a >= 16 && N == 16) {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(p));
    memcpy(b, &w, 16);
  } else if (valid == N && a >= 8 && N % 8 == 0) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(p) + j);
      memcpy(b + 8 * j, &w, 8);
    }
  } else if (valid == N && a >= 4) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(p) + j);
      memcpy(b + 4 * j, &w, 4);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j)
      b[j] = j < valid ? p[j] : 0;
  }
}

__device__ __forceinline__ float loadF32(const uint8_t* p, uint32_t baseAlign) {
  if (baseAlign >= 4)
    return __ldg(reinterpret_cast<const float*>(p));
  float f;
  memcpy(&f, p, 4);
  return f;
}
__device__ __forceinline__ void storeF32(uint8_t* p, uint32_t baseAlign, float f) {
  if (baseAlign >= 4) {
    *reinterpret_cast<float*>(p) = f;
  } else {
    memcpy(p, &f, 4);
  }
}
__device__ __forceinline__ uint32_t loadU32(const uint8_t* p, uint32_t baseAlign) {
  if (baseAlign >= 4)
    return __ldg(reinterpret_cast<const uint32_t*>(p));
  uint32_t u;
  memcpy(&u, p, 4);
  return u;
}

/// Grid-stride range of groups for this thread.
__device__ __forceinline__ uint64_t firstGroup() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t groupStride() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

/// The Workspace status: ~0 while no content error was found.
inline constexpr uint64_t kStatusOk = ~uint64_t{0};
__device__ __forceinline__ bool statusFailed(const uint64_t* status) {
  return *reinterpret_cast<const volatile uint64_t*>(status) != kStatusOk;
}
/// Records error `code` (lower codes are checked first, as the CPU decoder does) for an item.
__device__ __forceinline__ void recordError(uint64_t* status, uint32_t code, uint64_t item) {
  atomicMin(reinterpret_cast<unsigned long long*>(status),
            static_cast<unsigned long long>((static_cast<uint64_t>(code) << 48) |
                                            (item & 0xffffffffffffull)));
}

}  // namespace gs::kernels::dev
