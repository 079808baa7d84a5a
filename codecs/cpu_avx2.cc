// The AVX2 + F16C build of the codec decode loops, and the AVX2 kernels (the encode loops are
// cpu_avx2_encode.cc). Everything included before the target pragma is compiled for the
// baseline ISA, so inline functions this file shares with the portable build
// (whose out-of-line copies the linker may pick for either) never contain AVX2 instructions;
// only the loops below, in their own namespace, do. Called only when the CPU has AVX2 and F16C.
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
#include "codecs/cpu_decode_loops.inc"
}  // namespace avx2

const Kernels kAvx2Kernels = {&avx2::encodeAny, &avx2::decodeAny, "avx2"};

}  // namespace gs::codecs::cpu
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
namespace gs::codecs::cpu {
const Kernels kAvx2Kernels = kPortableKernels;
}  // namespace gs::codecs::cpu
#endif

// The main build compiles the encode loops apart, with their own flags (codecs/CMakeLists.txt
// defines GS_CPU_ENCODE_APART here); a build that lists only this file (fuzz/CMakeLists.txt) gets
// them in this translation unit, with the same results.
#if !defined(GS_CPU_ENCODE_APART)
#include "codecs/cpu_avx2_encode.cc"
#endif
