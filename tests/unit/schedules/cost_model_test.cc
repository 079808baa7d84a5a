// The alpha-beta-gamma model behind GS_ALGO=auto and gradstream-sim: the choices it must make.

#include "schedules/cost_model.h"

#include <cmath>

#include <gtest/gtest.h>

#include "schedules/schedule.h"
#include "schedules/topology.h"

namespace gs::stream {
namespace {

CostModel shmModel() {
  CostModel m;
  m.intraHost = CostModel::measured("shm");
  m.interHost = CostModel::measured("tcp");
  return m;
}

TEST(CostModel, TwoRanksSmallUncompressedTakeTheOneRoundExchange) {
  // The engine runs such a ring as one exchange: one round instead of halving-doubling's two.
  const Topology two = Topology::blocks(2, 2);
  const CostModel m = shmModel();
  for (double bytes : {8.0, 512.0, 4096.0}) {
    EXPECT_LT(predictAllReduceSeconds(Algorithm::kRing, two, bytes, m),
              predictAllReduceSeconds(Algorithm::kHalvingDoubling, two, bytes, m))
        << bytes;
    EXPECT_EQ(cheapestAllReduce(two, bytes, m), Algorithm::kRing) << bytes;
  }
  // Compressed chunks never take the exchange: the ring is priced as two phases then.
  CostModel compressed = m;
  compressed.codecRatio = 0.5;
  EXPECT_GT(predictAllReduceSeconds(Algorithm::kRing, two, 8, compressed),
            1.5 * m.intraHost.alphaSeconds);
}

TEST(CostModel, TwoRanksUncompressedTakeTheExchangeUpToItsLimitThenTheRing) {
  // The exchange up to kExchangeMaxBytes (the engine runs the 2-rank ring as it then), above it
  // the ring and halving-doubling are the same two rounds of halves, priced alike; the tie
  // goes to the ring. Recursive doubling's whole-buffer rounds cost more from there.
  const Topology two = Topology::blocks(2, 2);
  for (const char* transport : {"shm", "tcp"}) {
    CostModel m;
    m.intraHost = CostModel::measured(transport);
    const double limit = static_cast<double>(kExchangeMaxBytes);
    EXPECT_EQ(cheapestAllReduce(two, limit, m), Algorithm::kRing) << transport;
    EXPECT_LT(predictAllReduceSeconds(Algorithm::kRing, two, limit, m),
              predictAllReduceSeconds(Algorithm::kHalvingDoubling, two, limit, m))
        << transport;
    for (double bytes : {limit + 4, 1.0 * (1 << 20), 64.0 * (1 << 20)}) {
      EXPECT_EQ(predictAllReduceSeconds(Algorithm::kRing, two, bytes, m),
                predictAllReduceSeconds(Algorithm::kHalvingDoubling, two, bytes, m))
          << transport << " " << bytes;
      EXPECT_GT(predictAllReduceSeconds(Algorithm::kRecursiveDoubling, two, bytes, m),
                predictAllReduceSeconds(Algorithm::kRing, two, bytes, m))
          << transport << " " << bytes;
      EXPECT_EQ(cheapestAllReduce(two, bytes, m), Algorithm::kRing) << transport << " " << bytes;
    }
  }
}

TEST(CostModel, ManyRanksSmallMessagesAvoidTheRing) {
  const Topology big = Topology::blocks(1024, 8);
  const CostModel m = shmModel();
  const double ring = predictAllReduceSeconds(Algorithm::kRing, big, 8, m);
  EXPECT_GT(ring, 10 * predictAllReduceSeconds(Algorithm::kTree, big, 8, m));
  EXPECT_NE(cheapestAllReduce(big, 8, m), Algorithm::kRing);
}

TEST(CostModel, TimeGrowsWithSizeAndEdgeCasesAreDefined) {
  const CostModel m = shmModel();
  const Topology t = Topology::blocks(16, 4);
  for (Algorithm a : kAlgorithms) {
    double last = 0;
    for (double bytes = 8; bytes <= (1 << 30); bytes *= 16) {
      const double s = predictAllReduceSeconds(a, t, bytes, m);
      EXPECT_TRUE(std::isfinite(s)) << algorithmName(a) << " " << bytes;
      EXPECT_GT(s, last) << algorithmName(a) << " " << bytes;
      last = s;
    }
    EXPECT_EQ(predictAllReduceSeconds(a, Topology::blocks(1, 1), 1 << 20, m), 0.0);
  }
  // Hierarchical needs the same number of ranks on every host.
  const Topology uneven = Topology::fromHostNames({"a", "a", "a", "b"});
  EXPECT_TRUE(std::isinf(predictAllReduceSeconds(Algorithm::kHierarchical, uneven, 1 << 20, m)));
  EXPECT_NE(cheapestAllReduce(uneven, 1 << 20, m), Algorithm::kHierarchical);
}

// Ranks outnumbering cores (Topology::coresOf): measured on 2 cores (bench/algo_choice.sh), 3
// ranks over shm run the ring fastest while its chunks are left in the receivers' slots (up to
// 1 MiB calls here), halving-doubling or recursive doubling from the single copy on (4 MiB),
// whose fold leaves two ranks working; over tcp those two at every size from 64 KiB.
TEST(CostModel, ThreeRanksOnTwoCoresLeaveTheRingWhereItsStepsWaitForTheirReceivers) {
  Topology crowded = Topology::blocks(3, 3);
  crowded.coresOf = {2};
  const Topology unknown = Topology::blocks(3, 3);
  const auto isDoubling = [](Algorithm a) {
    return a == Algorithm::kHalvingDoubling || a == Algorithm::kRecursiveDoubling;
  };
  const double kib = 1024, mib = kib * kib;
  CostModel shm;
  shm.intraHost = CostModel::measured("shm");
  for (double bytes : {64 * kib, 256 * kib, 1 * mib})
    EXPECT_EQ(cheapestAllReduce(crowded, bytes, shm), Algorithm::kRing) << bytes;
  for (double bytes : {4 * mib, 16 * mib, 64 * mib}) {
    EXPECT_TRUE(isDoubling(cheapestAllReduce(crowded, bytes, shm))) << bytes;
    EXPECT_EQ(cheapestAllReduce(unknown, bytes, shm), Algorithm::kRing) << bytes;
  }
  CostModel tcp;
  tcp.intraHost = CostModel::measured("tcp");
  for (double bytes : {64 * kib, 1 * mib, 16 * mib}) {
    EXPECT_TRUE(isDoubling(cheapestAllReduce(crowded, bytes, tcp))) << bytes;
    EXPECT_EQ(cheapestAllReduce(unknown, bytes, tcp), Algorithm::kRing) << bytes;
  }
}

TEST(CostModel, CrowdingOnlySlowsAndNeedsMoreRanksThanCores) {
  for (const char* transport : {"shm", "tcp"}) {
    CostModel m;
    m.intraHost = CostModel::measured(transport);
    m.interHost = CostModel::measured("tcp");
    for (const Topology& base : {Topology::blocks(2, 2), Topology::blocks(4, 4),
                                 Topology::blocks(5, 5), Topology::blocks(8, 4)}) {
      Topology enough = base, crowded = base;
      enough.coresOf.assign(static_cast<size_t>(base.hosts()), base.maxPerHost());
      crowded.coresOf.assign(static_cast<size_t>(base.hosts()), 2);
      for (Algorithm a : kAlgorithms) {
        for (double bytes = 8; bytes <= (1 << 28); bytes *= 8) {
          const double none = predictAllReduceSeconds(a, base, bytes, m);
          EXPECT_EQ(predictAllReduceSeconds(a, enough, bytes, m), none)
              << transport << " " << algorithmName(a) << " " << bytes;
          const double slower = predictAllReduceSeconds(a, crowded, bytes, m);
          if (base.maxPerHost() <= 2)
            EXPECT_EQ(slower, none) << transport << " " << algorithmName(a) << " " << bytes;
          else if (std::isfinite(none))
            EXPECT_GE(slower, none) << transport << " " << algorithmName(a) << " " << bytes;
        }
      }
    }
  }
  // Four ranks on two cores over tcp: every rank works in every schedule, each priced 4x.
  CostModel tcp;
  tcp.intraHost = CostModel::measured("tcp");
  Topology four = Topology::blocks(4, 4);
  const double alone = predictAllReduceSeconds(Algorithm::kRing, four, 1 << 20, tcp);
  four.coresOf = {2};
  EXPECT_DOUBLE_EQ(predictAllReduceSeconds(Algorithm::kRing, four, 1 << 20, tcp), 4 * alone);
}

// A reduce's chunk (schedule.h): eight pieces of at least the link's piece from 512 KiB on, at
// most the communicator's chunk; the communicator's chunk below that and wherever ranks
// outnumber cores.
TEST(ReduceChunk, PiecesFromHalfAMebibyteUnlessCrowded) {
  const size_t kib = 1024, mib = kib * kib;
  const auto shm = static_cast<size_t>(CostModel::measured("shm").reducePieceBytes);
  const auto tcp = static_cast<size_t>(CostModel::measured("tcp").reducePieceBytes);
  EXPECT_EQ(shm, 128 * kib);
  EXPECT_EQ(tcp, 256 * kib);
  Topology two = Topology::blocks(2, 2);
  two.coresOf = {2};
  EXPECT_EQ(reduceChunkBytes(two, 256 * kib, mib, shm), mib);
  EXPECT_EQ(reduceChunkBytes(two, 512 * kib, mib, shm), 128 * kib);
  EXPECT_EQ(reduceChunkBytes(two, mib + 12, mib, shm), 128 * kib);
  EXPECT_EQ(reduceChunkBytes(two, mib + 12, mib, tcp), 256 * kib);  // four pieces over tcp
  EXPECT_EQ(reduceChunkBytes(two, 4 * mib, mib, shm), 512 * kib);
  EXPECT_EQ(reduceChunkBytes(two, 4 * mib, mib, tcp), 512 * kib);
  EXPECT_EQ(reduceChunkBytes(two, 4 * mib + 3, mib, shm), 512 * kib);  // 64 KiB granules
  EXPECT_EQ(reduceChunkBytes(two, 64 * mib, mib, shm), mib);
  EXPECT_EQ(reduceChunkBytes(two, 4 * mib, 256 * kib, shm), 256 * kib);
  EXPECT_EQ(reduceChunkBytes(Topology::blocks(2, 2), mib, mib, shm), 128 * kib);  // cores unknown
  Topology four = Topology::blocks(4, 4);
  four.coresOf = {2};
  EXPECT_TRUE(four.crowded());
  EXPECT_FALSE(two.crowded());
  EXPECT_EQ(reduceChunkBytes(four, 4 * mib, mib, shm), mib);
}

TEST(CostModel, MeasuredDefaultsOrderTheTransports) {
  const LinkCost shm = CostModel::measured("shm"), tcp = CostModel::measured("tcp");
  EXPECT_LT(shm.alphaSeconds, tcp.alphaSeconds);
  EXPECT_LT(shm.betaSecondsPerByte, tcp.betaSecondsPerByte);
  EXPECT_LT(CostModel::measured("verbs").alphaSeconds, tcp.alphaSeconds);
}

}  // namespace
}  // namespace gs::stream

namespace gs::stream {
namespace {

TEST(CostModel, ReduceTakesLinearOrTreeForSmallMessagesAndTheChainForLargeOnes) {
  CostModel m;
  m.intraHost = CostModel::measured("tcp");
  // Small messages: one round into the root while it handles few messages, log2 N rounds once
  // the root's share of N-1 messages outweighs them.
  const Topology eight = Topology::blocks(8, 8);
  EXPECT_EQ(cheapestReduce(eight, 8, m), ReduceAlgorithm::kLinear);
  EXPECT_EQ(cheapestReduce(Topology::blocks(4, 4), 8, m), ReduceAlgorithm::kLinear);
  EXPECT_EQ(cheapestReduce(Topology::blocks(32, 32), 8, m), ReduceAlgorithm::kTree);
  // The root's inbound link carries N-1 buffers in linear: from some KiB the tree's rounds win.
  EXPECT_EQ(cheapestReduce(eight, 64 << 10, m), ReduceAlgorithm::kTree);
  EXPECT_EQ(cheapestReduce(eight, 64 << 20, m), ReduceAlgorithm::kChain);
  // Two ranks: all three are one message into the root; the tie goes to the chain.
  const Topology two = Topology::blocks(2, 2);
  EXPECT_DOUBLE_EQ(predictReduceSeconds(ReduceAlgorithm::kTree, two, 1 << 20, m),
                   predictReduceSeconds(ReduceAlgorithm::kChain, two, 1 << 20, m));
  EXPECT_DOUBLE_EQ(predictReduceSeconds(ReduceAlgorithm::kLinear, two, 1 << 20, m),
                   predictReduceSeconds(ReduceAlgorithm::kChain, two, 1 << 20, m));
  EXPECT_EQ(cheapestReduce(two, 1 << 20, m), ReduceAlgorithm::kChain);
  EXPECT_EQ(predictReduceSeconds(ReduceAlgorithm::kChain, Topology::blocks(1, 1), 1e6, m), 0);
}

}  // namespace
}  // namespace gs::stream
