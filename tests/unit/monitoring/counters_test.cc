#include "monitoring/counters.h"

#include <gtest/gtest.h>

namespace gs::monitoring {
namespace {

TEST(LinkCounters, ChunkSentAddsBytesAndCodecCounts) {
  LinkCounters c(3);
  c.onChunkSent(4096, 2048 + 64, 2);
  c.onChunkSent(4096, 4096 + 64, 0);
  c.onChunkSent(100, 100, 99);  // out-of-range codec id counts as raw
  c.onChunkSent(100, 100, -1);
  EXPECT_EQ(c.peer, 3);
  EXPECT_EQ(c.bytesLogical.load(), 8392u);
  EXPECT_EQ(c.bytesWire.load(), 6472u);
  EXPECT_EQ(c.chunksSent.load(), 4u);
  EXPECT_EQ(c.chunksByCodec[0].load(), 3u);
  EXPECT_EQ(c.chunksByCodec[2].load(), 1u);
}

TEST(LinkCounters, ReceivedCreditAndGauges) {
  LinkCounters c(0);
  c.onChunkReceived(1000);
  c.onChunkReceived(24);
  c.addCreditWait(500);
  c.addCreditWait(1500);
  c.setGoodput(1.5e9);
  c.setChunkSize(1 << 20);
  c.setCodecRung(5);
  EXPECT_EQ(c.chunksReceived.load(), 2u);
  EXPECT_EQ(c.bytesReceived.load(), 1024u);
  EXPECT_EQ(c.creditWaitNs.load(), 2000u);
  EXPECT_DOUBLE_EQ(c.goodputBytesPerSecond.load(), 1.5e9);
  EXPECT_EQ(c.chunkSizeBytes.load(), 1u << 20);
  EXPECT_EQ(c.codecRung.load(), 5);
}

TEST(LinkCounters, ProgressTimestampIsWallClockAndMoves) {
  uint64_t before = unixNowNsCoarse();
  LinkCounters c(1);
  uint64_t t0 = c.lastProgressUnixNs.load();
  EXPECT_GE(t0 + 10'000'000, before);  // coarse clock: within its resolution
  c.lastProgressUnixNs.store(1);
  c.onChunkCompleted(5000);
  EXPECT_GE(c.lastProgressUnixNs.load(), before - 10'000'000);
  c.lastProgressUnixNs.store(1);
  c.onChunkReceived(1);
  EXPECT_GT(c.lastProgressUnixNs.load(), 1u);
  // A year 2020+ timestamp, not a steady-clock value.
  EXPECT_GT(c.lastProgressUnixNs.load(), 1'577'836'800ull * 1'000'000'000ull);
}

TEST(DurationHistogram, BucketsAreInclusiveUpperBounds) {
  LinkCounters c(0);
  c.onChunkCompleted(0);              // bucket 0 (<= 10us)
  c.onChunkCompleted(10'000);         // bucket 0 (inclusive)
  c.onChunkCompleted(10'001);         // bucket 1
  c.onChunkCompleted(1'000'000);      // bucket 4 (<= 1ms)
  c.onChunkCompleted(1'000'000'000);  // bucket 10 (<= 1s)
  c.onChunkCompleted(5'000'000'000);  // +Inf
  const auto& h = c.chunkLatency;
  EXPECT_EQ(h.counts[0].load(), 2u);
  EXPECT_EQ(h.counts[1].load(), 1u);
  EXPECT_EQ(h.counts[4].load(), 1u);
  EXPECT_EQ(h.counts[10].load(), 1u);
  EXPECT_EQ(h.counts[11].load(), 1u);
  EXPECT_EQ(h.sumNs.load(), 6'001'020'001u);
}

TEST(DurationHistogram, BoundsAreSorted) {
  for (size_t i = 1; i < kChunkLatencyBoundsNs.size(); ++i)
    EXPECT_LT(kChunkLatencyBoundsNs[i - 1], kChunkLatencyBoundsNs[i]);
  for (size_t i = 1; i < kCollectiveBoundsNs.size(); ++i)
    EXPECT_LT(kCollectiveBoundsNs[i - 1], kCollectiveBoundsNs[i]);
}

}  // namespace
}  // namespace gs::monitoring
