// Tree, halving-doubling and hierarchical allreduce: the symbolic checker over every N in
// 1..64 with 1..8 ranks per host and a sample of larger N, proof that the checker rejects
// broken variants of these schedules, and the shape properties the algorithms are chosen for.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "schedules/schedule.h"
#include "tests/unit/schedules/schedule_counts.h"

namespace gs::stream {
namespace {

constexpr Algorithm kNew[] = {Algorithm::kTree, Algorithm::kHalvingDoubling,
                              Algorithm::kHierarchical, Algorithm::kRecursiveDoubling};
constexpr Algorithm kFlat[] = {Algorithm::kTree, Algorithm::kHalvingDoubling,
                               Algorithm::kRecursiveDoubling};

// Hosts of the checks: consecutive blocks of `perHost` ranks, or ranks dealt round-robin over
// the hosts (rank r on host r % hosts), which makes local and cross-host groups non-contiguous.
Topology roundRobin(int nranks, int hosts) {
  Topology t;
  for (int r = 0; r < nranks; ++r)
    t.hostOf.push_back(r % hosts);
  return t;
}

// The checker costs about N^2 * count / 64 here, so count 1000 runs for N <= 16 only.
TEST(AllReduceAlgorithms, EveryNUpTo64WithOneToEightRanksPerHost) {
  int runs = 0;
  for (int n = 1; n <= 64; ++n) {
    for (size_t count : countsFor(n)) {
      if (count == 1000 && n > 16)
        continue;
      for (Algorithm algo : kFlat) {
        ASSERT_EQ(checkAllReduceSchedules(algo, Topology::blocks(n, 1), count), "")
            << algorithmName(algo) << " N=" << n << " count " << count;
        ++runs;
      }
      for (int perHost = 1; perHost <= 8; ++perHost) {
        if (n % perHost != 0)
          continue;
        ASSERT_EQ(
            checkAllReduceSchedules(Algorithm::kHierarchical, Topology::blocks(n, perHost), count),
            "")
            << perHost << " per host";
        ASSERT_EQ(
            checkAllReduceSchedules(Algorithm::kHierarchical, roundRobin(n, n / perHost), count),
            "")
            << perHost << " per host, round robin";
        runs += 2;
      }
    }
  }
  EXPECT_GT(runs, 2000);
}

TEST(AllReduceAlgorithms, LargerN) {
  for (int n : {127, 256, 1000}) {
    for (size_t count : {size_t{1}, static_cast<size_t>(n + 1)}) {
      if (n == 1000 && count == 1)
        continue;
      for (Algorithm algo : kFlat) {
        // Recursive doubling moves every contribution to every rank log2 N times: at 1000 ranks
        // its check would cost more than all the others together (minutes under the
        // sanitizers); its shape there is checked in
        // RecursiveDoublingSendsTheWholeBufferInLog2Rounds.
        if (algo == Algorithm::kRecursiveDoubling && n > 256)
          continue;
        EXPECT_EQ(checkAllReduceSchedules(algo, Topology::blocks(n, 1), count), "")
            << algorithmName(algo) << " N=" << n;
      }
      for (int perHost : {1, 2, 4, 8}) {
        if (n % perHost == 0) {
          EXPECT_EQ(checkAllReduceSchedules(Algorithm::kHierarchical, Topology::blocks(n, perHost),
                                            count),
                    "")
              << n << " ranks, " << perHost << " per host";
        }
      }
    }
  }
  // 127 is prime: hierarchical only with one rank per host; 1000 = 125 hosts x 8.
  EXPECT_EQ(checkAllReduceSchedules(Algorithm::kHierarchical, roundRobin(1000, 125), 1003), "");
}

TEST(AllReduceAlgorithms, HierarchicalRefusesUnevenHosts) {
  const std::string verdict =
      checkAllReduceSchedules(Algorithm::kHierarchical, Topology::blocks(10, 4), 100);
  EXPECT_NE(verdict.find("same number of ranks on every host"), std::string::npos) << verdict;
}

// The checker must be able to fail on these schedules: drop a step, redirect a send, double a
// forward, or skip the finalize, on one rank.
TEST(AllReduceAlgorithms, CheckerRejectsBrokenVariants) {
  const Topology topo = Topology::blocks(12, 4);
  const size_t count = 50;
  for (Algorithm algo : kNew) {
    const Schedule probe = buildAllReduce(algo, 5, topo, count);
    ASSERT_GE(probe.steps.size(), 2u) << algorithmName(algo);
    for (int mutation = 0; mutation < 4; ++mutation) {
      auto factory = [&](int rank) {
        Schedule s = buildAllReduce(algo, rank, topo, count);
        if (rank != 5)
          return s;
        switch (mutation) {
          case 0:
            s.steps.erase(s.steps.begin() + static_cast<long>(s.steps.size() / 2));
            break;
          case 1:
            for (Step& st : s.steps) {
              if (st.sendPeer >= 0) {
                st.sendPeer =
                    (st.sendPeer + 1) % 12 == 5 ? (st.sendPeer + 2) % 12 : (st.sendPeer + 1) % 12;
                break;
              }
            }
            break;
          case 2:
            s.steps.push_back(s.steps.back());
            break;
          case 3:
            for (Step& st : s.steps)
              st.finalize = false;
            break;
        }
        return s;
      };
      const std::string verdict =
          checkScheduleSet(CollectiveKind::kAllReduce, 12, 0, count, factory);
      // Rank 5 may not finalize anything in some algorithms; every other mutation must fail.
      if (mutation == 3) {
        bool finalizes = false;
        for (const Step& st : probe.steps)
          finalizes |= st.finalize;
        if (!finalizes)
          continue;
      }
      EXPECT_NE(verdict, "") << algorithmName(algo) << " mutation " << mutation;
    }
  }
}

std::set<int> peersOf(const Schedule& s) {
  std::set<int> peers;
  for (const Step& st : s.steps) {
    if (st.sendPeer >= 0)
      peers.insert(st.sendPeer);
    if (st.recvPeer >= 0)
      peers.insert(st.recvPeer);
  }
  return peers;
}

// Latency: tree and halving-doubling take O(log N) rounds where the ring takes 2(N-1); and a
// rank talks to a handful of peers, so connecting them all at start-up stays cheap.
TEST(AllReduceAlgorithms, LogarithmicStepsAndFewPeers) {
  const int n = 1024;
  for (int rank : {0, 1, 511, 1023}) {
    const Schedule tree = treeAllReduce(rank, n, 1 << 20);
    const Schedule hd = halvingDoublingAllReduce(rank, n, 1 << 20);
    EXPECT_LE(tree.steps.size(), 12u);
    EXPECT_LE(peersOf(tree).size(), 6u);
    EXPECT_EQ(hd.steps.size(), 20u);  // 10 halving + 10 doubling rounds
    EXPECT_EQ(peersOf(hd).size(), 10u);
  }
  // Not a power of two: the folded ranks add one step each way.
  EXPECT_EQ(halvingDoublingAllReduce(0, 1000, 4096).steps.size(), 2u);
  EXPECT_EQ(halvingDoublingAllReduce(1, 1000, 4096).steps.size(), 20u);
  // Hierarchical: 2 (L-1) intra-host steps plus the cross-host halving-doubling.
  const Schedule h = hierarchicalAllReduce(3, Topology::blocks(64, 8), 1 << 20);
  EXPECT_EQ(h.steps.size(), 2u * 7 + 6);
}

// Recursive doubling: half halving-doubling's messages on the critical path (each the whole
// buffer), and the order of every reduction fixed by rank so that replicas agree bit for bit.
TEST(AllReduceAlgorithms, RecursiveDoublingSendsTheWholeBufferInLog2Rounds) {
  auto sends = [](const Schedule& s, size_t count) {
    int n = 0;
    for (const Step& st : s.steps) {
      if (st.sendPeer >= 0) {
        EXPECT_EQ(st.send.count, count);
        ++n;
      }
    }
    return n;
  };
  for (int rank : {0, 1, 511, 1023})
    EXPECT_EQ(sends(recursiveDoublingAllReduce(rank, 1024, 77), 77), 10) << rank;
  // Not a power of two (1000 = 512 + 488): the folded ranks send once, their partners add a
  // send back; the others run the 9 rounds of 512.
  EXPECT_EQ(sends(recursiveDoublingAllReduce(0, 1000, 5), 5), 1);
  EXPECT_EQ(sends(recursiveDoublingAllReduce(1, 1000, 5), 5), 10);
  EXPECT_EQ(sends(recursiveDoublingAllReduce(999, 1000, 5), 5), 9);
  for (int n : {2, 3, 4, 6, 8, 12}) {
    for (int rank = 0; rank < n; ++rank) {
      const Schedule s = recursiveDoublingAllReduce(rank, n, 9);
      int finalized = 0;
      for (size_t k = 0; k < s.steps.size(); ++k) {
        const Step& st = s.steps[k];
        finalized += st.finalize ? 1 : 0;
        // Both ends of a round compute op(lower rank's value, higher rank's value). (A rank
        // whose first step receives is a fold's: that reduction happens on one rank only.)
        if (st.recvPeer >= 0 && st.action == RecvAction::kReduceWith && k > 0)
          EXPECT_EQ(st.incomingFirst, st.recvPeer < rank) << "N=" << n << " rank " << rank;
      }
      const bool folded = rank < 2 * (n - (n >= 8 ? 8 : n >= 4 ? 4 : 2)) && rank % 2 == 0;
      EXPECT_EQ(finalized, folded ? 0 : 1) << "N=" << n << " rank " << rank;
    }
  }
  // The 2-rank latency-bound ring is this exchange.
  EXPECT_EQ(buildSchedule(CollectiveKind::kAllReduce, 1, 2, 0, 10, true).steps.size(),
            recursiveDoublingAllReduce(1, 2, 10).steps.size());
}

// Complementary trees: no rank is an inner node (two children) of both trees, so each rank's
// links carry about the buffer once each way.
TEST(AllReduceAlgorithms, TreesAreComplementary) {
  for (int n : {8, 9, 64, 100}) {
    for (int rank = 0; rank < n; ++rank) {
      const Schedule s = treeAllReduce(rank, n, 2 * static_cast<size_t>(n));
      size_t sentElements = 0;
      for (const Step& st : s.steps) {
        if (st.sendPeer >= 0)
          sentElements += st.forwards() ? s.count / 2 : st.send.count;
      }
      // One tree: up to 3 sends of half the buffer (parent, 2 children); both trees together
      // must stay well below the 6 halves a rank inner in both would send.
      EXPECT_LE(sentElements, 2 * s.count) << "N=" << n << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace gs::stream
