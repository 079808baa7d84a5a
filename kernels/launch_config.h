#pragma once

// Launch geometry of the codec kernels: pure host arithmetic (no CUDA), unit-tested without a
// device (tests/unit/kernels/launch_config_test.cc).
//
// Every elementwise kernel works on groups of kGroup consecutive elements per thread (one or more
// 16-byte loads for float32, fp16, bf16 and float64 elements), in a grid-stride loop over a grid
// sized from the device: at most blocksPerSm resident blocks of kThreads on each SM, fewer when
// there is less work. Block codecs work on tiles of whole codec blocks (block sizes are
// multiples of 8, so a group never straddles two codec blocks).

#include <cstdint>

#if defined(__CUDACC__)
#define GS_LAUNCH_HD __host__ __device__
#else
#define GS_LAUNCH_HD
#endif

namespace gs::kernels {

inline constexpr uint32_t kThreads = 256;  // threads per block of every codec kernel
inline constexpr uint32_t kGroup = 8;      // elements per thread and step
inline constexpr uint32_t kTileElements = kThreads * kGroup;  // block codecs: one group each

/// Blocks for `work` items of which one block handles `perBlock` per step: enough to cover the
/// work once, at most a full wave (smCount * blocksPerSm), at least 1; 0 when there is no work.
inline uint32_t gridBlocks(uint64_t work,
                           uint64_t perBlock,
                           uint32_t smCount,
                           uint32_t blocksPerSm) {
  if (work == 0)
    return 0;
  const uint64_t need = (work + perBlock - 1) / perBlock;
  uint64_t wave = static_cast<uint64_t>(smCount) * blocksPerSm;
  if (wave == 0)
    wave = 1;
  return static_cast<uint32_t>(need < wave ? need : wave);
}

GS_LAUNCH_HD inline uint64_t groupsOf(uint64_t count) {
  return (count + kGroup - 1) / kGroup;
}

/// Block codecs: a tile is as many whole codec blocks as fit in kTileElements (one group per
/// thread, held in registers between the absmax and the quantize pass), or one codec block when
/// blocks are larger (the block is read twice, the second time from cache).
struct BlockTiling {
  uint32_t blocksPerTile;
  uint32_t tileElements;
  uint64_t tiles;
  bool inRegisters;  // every thread holds at most one group of a tile
};
inline BlockTiling blockTiling(uint64_t count, uint32_t blockSize) {
  BlockTiling t{};
  if (blockSize <= kTileElements) {
    t.blocksPerTile = kTileElements / blockSize;
    t.tileElements = t.blocksPerTile * blockSize;
    t.inRegisters = true;
  } else {
    t.blocksPerTile = 1;
    t.tileElements = blockSize;
    t.inRegisters = false;
  }
  t.tiles = (count + t.tileElements - 1) / t.tileElements;
  return t;
}

/// Largest power of two, at most 16, that divides the address (vector access is used where it
/// allows; the kernels fall back to narrower accesses otherwise).
GS_LAUNCH_HD inline uint32_t alignmentOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (uint32_t k = 16; k > 1; k /= 2) {
    if (a % k == 0)
      return k;
  }
  return 1;
}

/// Top-k selection: tiles of kTileElements elements for the ordered compaction.
GS_LAUNCH_HD inline uint64_t topkTiles(uint64_t count) {
  return (count + kTileElements - 1) / kTileElements;
}

}  // namespace gs::kernels
