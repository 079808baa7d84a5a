// The portable build of the codec loops (the baseline ISA; SSE2 on x86-64).
#include <cstring>
#include <type_traits>

#include "codecs/cpu_kernels.h"
#include "format/block_math.h"

#define GS_CPU_AVX2 0

namespace gs::codecs::cpu {
namespace portable {
#include "codecs/cpu_loops.inc"
}  // namespace portable

const Kernels kPortableKernels = {&portable::encodeAny, &portable::decodeAny, "portable"};

}  // namespace gs::codecs::cpu
