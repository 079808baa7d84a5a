// The portable build of the codec encode loops (the baseline ISA; SSE2 on x86-64). Its own
// translation unit for its compile flags (cpu_encode_loops.inc).
#include <cstring>
#include <type_traits>

#include "codecs/cpu_kernels.h"
#include "format/block_math.h"

#define GS_CPU_AVX2 0

namespace gs::codecs::cpu {
namespace portable {
#include "codecs/cpu_encode_loops.inc"
}  // namespace portable

}  // namespace gs::codecs::cpu
