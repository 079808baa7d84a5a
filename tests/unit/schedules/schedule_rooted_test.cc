// Reduce (chain and binomial tree) and all-to-all schedules: the symbolic checker over every
// N, root and count the other schedules are checked with, uneven all-to-all layouts with empty
// pairs and gaps, and mutations the checker must catch (so a pass means something).
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "schedules/schedule.h"
#include "tests/unit/schedules/schedule_counts.h"

namespace gs::stream {
namespace {

std::vector<int> ranksToTry() {
  std::vector<int> ns;
  for (int n = 1; n <= 17; ++n)
    ns.push_back(n);
  for (int n : {31, 32, 33, 64})
    ns.push_back(n);
  return ns;
}

std::vector<int> rootsToTry(int n) {
  if (n <= 9) {
    std::vector<int> all;
    for (int r = 0; r < n; ++r)
      all.push_back(r);
    return all;
  }
  return {0, n / 2, n - 1};
}

TEST(ReduceSchedules, EveryAlgorithmRootAndCountGiveTheRootTheReduction) {
  for (ReduceAlgorithm algo :
       {ReduceAlgorithm::kChain, ReduceAlgorithm::kTree, ReduceAlgorithm::kLinear}) {
    for (int n : ranksToTry()) {
      for (int root : rootsToTry(n)) {
        for (size_t count : countsFor(n)) {
          const std::string verdict = checkReduceSchedules(algo, n, root, count);
          EXPECT_EQ(verdict, "") << reduceAlgorithmName(algo) << " N=" << n << " root=" << root
                                 << " count=" << count;
        }
      }
    }
  }
}

TEST(ReduceSchedules, TheChainMovesTheBufferOncePerLinkAndTheTreeTakesLog2Rounds) {
  for (int n : ranksToTry()) {
    for (int root : rootsToTry(n)) {
      int chainSends = 0, rootRounds = 0;
      for (int r = 0; r < n; ++r) {
        const Schedule chain = chainReduce(r, n, root, 10);
        for (const Step& st : chain.steps)
          chainSends += st.sendPeer >= 0 ? 1 : 0;
        EXPECT_EQ(chain.recvCount, r == root ? 10u : 0u) << "N=" << n << " rank " << r;
        if (r == root)
          rootRounds = static_cast<int>(treeReduce(r, n, root, 10).steps.size());
      }
      EXPECT_EQ(chainSends, n - 1) << "N=" << n;
      int log2n = 0;
      while ((1 << log2n) < n)
        ++log2n;
      EXPECT_EQ(rootRounds, log2n) << "N=" << n << " root=" << root;
    }
  }
}

// Linear: one round. Every other rank sends its buffer straight to the root, which takes one
// message from each, in rank order from its own, the last one finalizing.
TEST(ReduceSchedules, LinearSendsEveryBufferStraightToTheRootInOneRound) {
  for (int n : ranksToTry()) {
    for (int root : rootsToTry(n)) {
      for (int r = 0; r < n; ++r) {
        const Schedule s = buildReduce(ReduceAlgorithm::kLinear, r, n, root, 10);
        if (n == 1) {
          EXPECT_TRUE(s.steps.empty());
          continue;
        }
        if (r != root) {
          ASSERT_EQ(s.steps.size(), 1u) << "N=" << n << " rank " << r;
          EXPECT_EQ(s.steps[0].sendPeer, root);
          EXPECT_EQ(s.steps[0].recvPeer, -1);
          EXPECT_EQ(s.recvCount, 0u);
          continue;
        }
        ASSERT_EQ(s.steps.size(), static_cast<size_t>(n - 1)) << "N=" << n << " root " << root;
        for (int k = 0; k < n - 1; ++k) {
          EXPECT_EQ(s.steps[k].recvPeer, (root + k + 1) % n);
          EXPECT_EQ(s.steps[k].sendPeer, -1);
          EXPECT_EQ(s.steps[k].finalize, k == n - 2);
        }
      }
    }
  }
}

TEST(ReduceSchedules, TheCheckerCatchesAMissingFinalizeAndAChildThatSendsElsewhere) {
  const int n = 6, root = 2;
  std::string verdict = checkScheduleSet(CollectiveKind::kReduce, n, root, 5, [&](int r) {
    Schedule s = treeReduce(r, n, root, 5);
    if (r == root)
      s.steps.back().finalize = false;
    return s;
  });
  EXPECT_NE(verdict.find("rank 2"), std::string::npos) << verdict;
  verdict = checkScheduleSet(CollectiveKind::kReduce, n, root, 5, [&](int r) {
    Schedule s = chainReduce(r, n, root, 5);
    if (r == 1)  // the chain's tail sends past its neighbour
      s.steps.back().sendPeer = 4;
    return s;
  });
  EXPECT_NE(verdict, "");
}

TEST(AllToAllSchedules, UniformLayoutsForEveryN) {
  for (int n : ranksToTry()) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}}) {
      if (n > 17 && count == 1000)
        continue;
      std::vector<AllToAllLayout> layouts(n, AllToAllLayout::uniform(n, count));
      EXPECT_EQ(checkAllToAllSchedules(layouts), "") << "N=" << n << " count=" << count;
    }
  }
}

// alltoallv as MoE dispatch calls it: uneven counts, empty pairs, blocks in any order with
// gaps between them.
std::vector<AllToAllLayout> randomLayouts(int n, std::mt19937& rng) {
  std::vector<std::vector<size_t>> counts(n, std::vector<size_t>(n));
  for (auto& row : counts) {
    for (auto& c : row)
      c = rng() % 3 == 0 ? 0 : rng() % 6;
  }
  auto place = [&](const std::vector<size_t>& sizes, std::vector<size_t>* displs) {
    std::vector<int> order(sizes.size());
    for (size_t j = 0; j < order.size(); ++j)
      order[j] = static_cast<int>(j);
    std::shuffle(order.begin(), order.end(), rng);
    displs->assign(sizes.size(), 0);
    size_t at = 0;
    for (int j : order) {
      at += rng() % 3;  // a gap the receive must leave alone
      (*displs)[j] = at;
      at += sizes[j];
    }
  };
  std::vector<AllToAllLayout> layouts(n);
  for (int r = 0; r < n; ++r) {
    AllToAllLayout& l = layouts[r];
    l.sendCounts = counts[r];
    for (int i = 0; i < n; ++i)
      l.recvCounts.push_back(counts[i][r]);
    place(l.sendCounts, &l.sendDispls);
    place(l.recvCounts, &l.recvDispls);
  }
  return layouts;
}

TEST(AllToAllSchedules, UnevenLayoutsWithEmptyPairsAndGaps) {
  std::mt19937 rng(20261202);
  for (int n = 1; n <= 9; ++n) {
    for (int trial = 0; trial < 20; ++trial) {
      const auto layouts = randomLayouts(n, rng);
      EXPECT_EQ(checkAllToAllSchedules(layouts), "") << "N=" << n << " trial " << trial;
    }
  }
}

TEST(AllToAllSchedules, SendsThenReceivesOnePerPeerAndEmptyPairsStillAnnounce) {
  const int n = 5;
  const AllToAllLayout layout = AllToAllLayout::uniform(n, 0);
  for (int r = 0; r < n; ++r) {
    const Schedule s = pairwiseAllToAll(r, n, layout);
    ASSERT_EQ(s.steps.size(), static_cast<size_t>(2 * (n - 1)));
    std::vector<bool> sentTo(n, false), heardFrom(n, false);
    for (const Step& st : s.steps) {
      EXPECT_TRUE(st.announceEmpty);
      EXPECT_FALSE(st.forwards());
      EXPECT_NE(st.sendPeer >= 0, st.recvPeer >= 0);  // a send or a receive, not both
      if (st.sendPeer >= 0)
        sentTo[st.sendPeer] = true;
      if (st.recvPeer >= 0)
        heardFrom[st.recvPeer] = true;
    }
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(sentTo[p], p != r) << "rank " << r << " peer " << p;
      EXPECT_EQ(heardFrom[p], p != r) << "rank " << r << " peer " << p;
    }
  }
}

TEST(AllToAllSchedules, MismatchedPairsAndMisplacedBlocksAreCaught) {
  std::vector<AllToAllLayout> layouts(3, AllToAllLayout::uniform(3, 4));
  layouts[2].sendCounts[0] = 5;
  EXPECT_EQ(checkAllToAllSchedules(layouts),
            "alltoall: rank 2 sends 5 elements to rank 0, which expects 4");
  const int n = 4;
  const std::vector<AllToAllLayout> uniform(n, AllToAllLayout::uniform(n, 2));
  const std::string verdict = checkAllToAllSchedules(uniform, [&](int r) {
    Schedule s = pairwiseAllToAll(r, n, uniform[r]);
    if (r == 3)
      s.steps[n - 1].dst.offset = 0;  // rank 2's block written where rank 3's own block 0 lands
    return s;
  });
  EXPECT_NE(verdict.find("rank 3"), std::string::npos) << verdict;
  EXPECT_NE(checkScheduleSet(CollectiveKind::kAllToAll, n, 0, 2,
                             [&](int r) { return pairwiseAllToAll(r, n, uniform[r]); }),
            "");
}

}  // namespace
}  // namespace gs::stream
