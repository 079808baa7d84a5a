// The AVX2 + F16C build of the codec encode loops, in its own translation unit for its compile
// flags (cpu_encode_loops.inc); the kernels are defined in cpu_avx2.cc, whose notes on the
// target pragma apply here too. Called only when the CPU has AVX2 and F16C.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "codecs/cpu_kernels.h"
#include "format/block_math.h"

#if defined(__x86_64__)
#define GS_CPU_AVX2 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

namespace gs::codecs::cpu {
namespace avx2 {
#include "codecs/cpu_encode_loops.inc"
}  // namespace avx2

}  // namespace gs::codecs::cpu
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
