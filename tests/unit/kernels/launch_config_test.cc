// Launch geometry of the codec kernels: host arithmetic, no device needed.
#include "kernels/launch_config.h"

#include <gtest/gtest.h>

namespace gs::kernels {
namespace {

TEST(LaunchConfig, GridCoversTheWorkOnceAndAtMostOneWave) {
  EXPECT_EQ(gridBlocks(0, kThreads, 132, 8), 0u);
  EXPECT_EQ(gridBlocks(1, kThreads, 132, 8), 1u);
  EXPECT_EQ(gridBlocks(kThreads, kThreads, 132, 8), 1u);
  EXPECT_EQ(gridBlocks(kThreads + 1, kThreads, 132, 8), 2u);
  // 256 MiB of float32 in groups of 8: far more than a wave of an H200 (132 SMs x 8 blocks).
  EXPECT_EQ(gridBlocks(groupsOf(64u << 20), kThreads, 132, 8), 132u * 8);
  EXPECT_EQ(gridBlocks(1000, 1, 0, 0), 1u) << "a device reporting no SMs still gets one block";
}

TEST(LaunchConfig, GroupsRoundUp) {
  EXPECT_EQ(groupsOf(0), 0u);
  EXPECT_EQ(groupsOf(1), 1u);
  EXPECT_EQ(groupsOf(8), 1u);
  EXPECT_EQ(groupsOf(9), 2u);
  EXPECT_EQ(groupsOf((1u << 20) + 3), (1u << 17) + 1);
}

TEST(LaunchConfig, BlockTilesHoldWholeCodecBlocks) {
  for (uint32_t block : {8u, 24u, 256u, 1000u, 2048u, 2056u, 65536u}) {
    for (uint64_t count : {uint64_t{1}, uint64_t{7}, uint64_t{4097}, uint64_t{(1u << 20) + 3}}) {
      const BlockTiling t = blockTiling(count, block);
      SCOPED_TRACE(testing::Message() << "block " << block << " count " << count);
      EXPECT_EQ(t.tileElements % block, 0u);
      EXPECT_GE(t.blocksPerTile, 1u);
      EXPECT_LE(t.blocksPerTile, kThreads) << "shared memory holds one absmax per thread";
      EXPECT_EQ(t.inRegisters, t.tileElements <= kTileElements);
      EXPECT_GE(t.tiles * t.tileElements, count);
      EXPECT_LT((t.tiles - 1) * t.tileElements, count);
    }
  }
  EXPECT_EQ(blockTiling(100, 256).tileElements, 2048u);
  EXPECT_EQ(blockTiling(100, 24).tileElements, 85u * 24);
  EXPECT_EQ(blockTiling(100, 4096).tileElements, 4096u);
  EXPECT_FALSE(blockTiling(100, 4096).inRegisters);
}

TEST(LaunchConfig, AlignmentIsTheLargestPowerOfTwoUpTo16) {
  alignas(64) unsigned char buf[64];
  EXPECT_EQ(alignmentOf(buf), 16u);
  EXPECT_EQ(alignmentOf(buf + 1), 1u);
  EXPECT_EQ(alignmentOf(buf + 2), 2u);
  EXPECT_EQ(alignmentOf(buf + 4), 4u);
  EXPECT_EQ(alignmentOf(buf + 8), 8u);
  EXPECT_EQ(alignmentOf(buf + 12), 4u);
  EXPECT_EQ(alignmentOf(buf + 32), 16u);
  EXPECT_EQ(alignmentOf(nullptr), 16u);
}

TEST(LaunchConfig, TopkTiles) {
  EXPECT_EQ(topkTiles(0), 0u);
  EXPECT_EQ(topkTiles(1), 1u);
  EXPECT_EQ(topkTiles(kTileElements), 1u);
  EXPECT_EQ(topkTiles(kTileElements + 1), 2u);
}

}  // namespace
}  // namespace gs::kernels
