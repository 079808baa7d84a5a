// GS_ALGO_TUNE's bookkeeping (control/algorithm_tuner.h), fed times directly: the trial order
// in blocks, the warm-up round and each block's first call left out, the medians every rank agrees
// on, the decision that keeps the model's choice unless another is clearly faster, and ranks that
// disagree still deciding alike. The communicator's side (agreement allreduce, real ranks) is
// AutoAlgorithm.* in tests/unit/capi/collectives_test.cc.
#include "control/algorithm_tuner.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace gs::control {
namespace {

using stream::Algorithm;

// Call i of a trial: its candidate's index among n, and whether its time must be left out (a
// warm-up round, or the first call of a block: the switch from another schedule).
struct TrialCall {
  size_t candidate;
  bool dropped;
};
TrialCall trialCall(size_t i, size_t n) {
  const size_t block = i / AlgorithmTuner::kBlockCalls;
  const size_t round = block / n;
  return {(block % n + round) % n, round < static_cast<size_t>(AlgorithmTuner::kWarmUpRounds) ||
                                       i % AlgorithmTuner::kBlockCalls == 0};
}

// Runs every trial of `key`, timing candidate k's measured calls at timesUs[k] and every
// left-out call at 100 ms, and returns the order the calls ran in.
std::vector<Algorithm> runTrials(AlgorithmTuner& t,
                                 const AlgorithmTuner::Key& key,
                                 const std::vector<Algorithm>& candidates,
                                 const std::vector<int64_t>& timesUs) {
  std::vector<Algorithm> order;
  while (!t.trialsDone(key)) {
    const Algorithm a = t.nextTrial(key);
    order.push_back(a);
    size_t k = 0;
    while (candidates[k] != a)
      ++k;
    // The warm-up rounds are slow (links made at first use), a block's first call pays for the
    // switch: neither may count.
    const bool dropped = trialCall(order.size() - 1, candidates.size()).dropped;
    t.record((dropped ? 100000 : timesUs[k]) * 1000);
  }
  return order;
}

std::vector<int64_t> maxOf(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    out[i] = std::max(a[i], b[i]);
  return out;
}

TEST(AlgorithmTuner, TriesEachCandidateInRoundsThenKeepsTheFastest) {
  AlgorithmTuner t;
  const AlgorithmTuner::Key key{128 << 10, nullptr};
  const std::vector<Algorithm> c = {Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling,
                                    Algorithm::kRing};
  EXPECT_FALSE(t.decided(key));
  t.begin(key, c);
  EXPECT_TRUE(t.inTrial(key));
  const auto order = runTrials(t, key, c, {280, 170, 550});
  ASSERT_EQ(order.size(), c.size() * AlgorithmTuner::kBlockCalls *
                              (AlgorithmTuner::kWarmUpRounds + AlgorithmTuner::kMeasuredRounds));
  // Every round runs a block of each candidate, each round starting one candidate later.
  for (size_t i = 0; i < order.size(); ++i)
    EXPECT_EQ(order[i], c[trialCall(i, c.size()).candidate]) << "call " << i;
  // The same order written out, apart from the formula above: a block per letter (h:
  // halving-doubling, d: recursive doubling, r: ring), a round per group, the first the warm-up.
  static_assert(AlgorithmTuner::kBlockCalls == 4 && AlgorithmTuner::kWarmUpRounds == 1 &&
                    AlgorithmTuner::kMeasuredRounds == 4,
                "the written-out order below is for blocks of 4 calls and 1 + 4 rounds");
  std::string blocks;
  for (size_t i = 0; i < order.size(); i += AlgorithmTuner::kBlockCalls) {
    if (i > 0 && (i / AlgorithmTuner::kBlockCalls) % c.size() == 0)
      blocks += ' ';  // a new round
    for (size_t j = i + 1; j < i + AlgorithmTuner::kBlockCalls; ++j)
      EXPECT_EQ(order[j], order[i]) << "call " << j << " left its block";
    blocks += order[i] == Algorithm::kHalvingDoubling     ? 'h'
              : order[i] == Algorithm::kRecursiveDoubling ? 'd'
                                                          : 'r';
  }
  EXPECT_EQ(blocks, "hdr drh rhd hdr drh");
  EXPECT_EQ(order[0], order[AlgorithmTuner::kBlockCalls - 1]) << "the first block switched";
  EXPECT_NE(order[0], order[AlgorithmTuner::kBlockCalls]) << "the second block did not switch";
  const auto words = t.agreementVector(key);
  ASSERT_EQ(words.size(), AlgorithmTuner::kAgreementWords);
  EXPECT_EQ(words[0], 280000);  // medians of the measured calls: the left-out ones are slow
  EXPECT_EQ(words[1], 170000);
  const auto d = t.decide(key, words);
  EXPECT_TRUE(d.consistent);
  EXPECT_EQ(d.algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_EQ(t.decided(key), Algorithm::kRecursiveDoubling);
  EXPECT_FALSE(t.inTrial(key));
  EXPECT_EQ(describeTrials(d),
            "halving_doubling 280.0 us, recursive_doubling 170.0 us, ring 550.0 us");
}

TEST(AlgorithmTuner, TheModelsChoiceStaysUnlessAnotherIsClearlyFaster) {
  const std::vector<Algorithm> c = {Algorithm::kHalvingDoubling, Algorithm::kRing};
  for (const auto& [ring, want] : {std::pair<int64_t, Algorithm>{95, Algorithm::kHalvingDoubling},
                                   std::pair<int64_t, Algorithm>{85, Algorithm::kRing}}) {
    AlgorithmTuner t;
    const AlgorithmTuner::Key key{1 << 20, nullptr};
    t.begin(key, c);
    runTrials(t, key, c, {100, ring});
    EXPECT_EQ(t.decide(key, t.agreementVector(key)).algorithm, want) << "ring at " << ring;
  }
}

// Two ranks: the slowest rank's median decides (rank 1 is slow on recursive doubling), and both
// take it from the same reduced words.
TEST(AlgorithmTuner, TheSlowestRankDecidesForAll) {
  const std::vector<Algorithm> c = {Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling};
  AlgorithmTuner r0, r1;
  const AlgorithmTuner::Key key{256 << 10, nullptr};
  r0.begin(key, c);
  r1.begin(key, c);
  runTrials(r0, key, c, {300, 200});
  runTrials(r1, key, c, {310, 400});
  const auto agreed = maxOf(r0.agreementVector(key), r1.agreementVector(key));
  EXPECT_EQ(r0.decide(key, agreed).algorithm, Algorithm::kHalvingDoubling);
  EXPECT_EQ(r1.decide(key, agreed).algorithm, Algorithm::kHalvingDoubling);
}

// Ranks that tried different candidates (settings that should have matched) still decide alike,
// and say so.
TEST(AlgorithmTuner, RanksWithDifferentCandidatesStillDecideAlike) {
  AlgorithmTuner r0, r1;
  const AlgorithmTuner::Key key{64 << 10, nullptr};
  const std::vector<Algorithm> c0 = {Algorithm::kRing, Algorithm::kTree};
  const std::vector<Algorithm> c1 = {Algorithm::kHalvingDoubling, Algorithm::kRing};
  r0.begin(key, c0);
  r1.begin(key, c1);
  runTrials(r0, key, c0, {100, 200});
  runTrials(r1, key, c1, {100, 200});
  const auto agreed = maxOf(r0.agreementVector(key), r1.agreementVector(key));
  const auto d0 = r0.decide(key, agreed), d1 = r1.decide(key, agreed);
  EXPECT_FALSE(d0.consistent);
  EXPECT_FALSE(d1.consistent);
  EXPECT_EQ(d0.algorithm, d1.algorithm);
}

// Sizes are tuned apart, and the oldest is forgotten beyond kRememberedSizes (then tuned again).
TEST(AlgorithmTuner, SizesAreTunedApartAndTheOldestIsForgotten) {
  AlgorithmTuner t;
  const std::vector<Algorithm> c = {Algorithm::kRing, Algorithm::kHalvingDoubling};
  for (size_t i = 0; i < AlgorithmTuner::kRememberedSizes + 1; ++i) {
    const AlgorithmTuner::Key key{(64 << 10) + i, nullptr};
    t.begin(key, c);
    runTrials(t, key, c, {100, i % 2 == 0 ? 50 : 150});
    const auto d = t.decide(key, t.agreementVector(key));
    EXPECT_EQ(d.algorithm, i % 2 == 0 ? Algorithm::kHalvingDoubling : Algorithm::kRing) << i;
  }
  EXPECT_FALSE(t.decided({64 << 10, nullptr})) << "the oldest size is still remembered";
  EXPECT_EQ(t.decided({(64 << 10) + 1, nullptr}), Algorithm::kRing);
  const codecs::Codec* other = reinterpret_cast<const codecs::Codec*>(&t);
  EXPECT_FALSE(t.decided({(64 << 10) + 1, other})) << "another codec is another key";
}

}  // namespace
}  // namespace gs::control
