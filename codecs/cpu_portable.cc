// The portable build of the codec decode loops (the baseline ISA; SSE2 on x86-64), and the
// portable kernels. The encode loops are cpu_portable_encode.cc.
#include <cstring>
#include <type_traits>

#include "codecs/cpu_kernels.h"
#include "format/block_math.h"

#define GS_CPU_AVX2 0

namespace gs::codecs::cpu {
namespace portable {
#include "codecs/cpu_decode_loops.inc"
}  // namespace portable

const Kernels kPortableKernels = {&portable::encodeAny, &portable::decodeAny, "portable"};

}  // namespace gs::codecs::cpu

// The main build compiles the encode loops apart, with their own flags (codecs/CMakeLists.txt
// defines GS_CPU_ENCODE_APART here); a build that lists only this file (fuzz/CMakeLists.txt) gets
// them in this translation unit, with the same results.
#if !defined(GS_CPU_ENCODE_APART)
#include "codecs/cpu_portable_encode.cc"
#endif
