#include "control/algorithm_tuner.h"

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace gs::control {

std::optional<stream::Algorithm> AlgorithmTuner::decided(const Key& key) const {
  for (const Settled& s : settled_) {
    if (s.key == key)
      return s.algorithm;
  }
  return std::nullopt;
}

const AlgorithmTuner::Trial* AlgorithmTuner::findTrial(const Key& key) const {
  for (const Trial& t : trials_) {
    if (t.key == key)
      return &t;
  }
  return nullptr;
}

AlgorithmTuner::Trial* AlgorithmTuner::findTrial(const Key& key) {
  return const_cast<Trial*>(std::as_const(*this).findTrial(key));
}

void AlgorithmTuner::begin(const Key& key, std::vector<stream::Algorithm> candidates) {
  GS_CHECK(candidates.size() >= 2 && candidates.size() <= kMaxCandidates, Errc::kInternal,
           "%zu candidate schedules to tune (2..%zu)", candidates.size(), kMaxCandidates);
  if (trials_.size() + settled_.size() >= kRememberedSizes) {
    // The oldest decision goes first; trials only when nothing is decided (all sizes new).
    if (!settled_.empty())
      settled_.pop_front();
    else
      trials_.pop_front();
  }
  Trial t;
  t.key = key;
  t.times.resize(candidates.size());
  t.candidates = std::move(candidates);
  trials_.push_back(std::move(t));
}

bool AlgorithmTuner::trialsDone(const Key& key) const {
  const Trial* t = findTrial(key);
  return t != nullptr && t->calls >= totalCalls(*t);
}

stream::Algorithm AlgorithmTuner::nextTrial(const Key& key) {
  Trial* t = findTrial(key);
  GS_CHECK(t != nullptr && t->calls < totalCalls(*t), Errc::kInternal,
           "no trial left for an allreduce of %zu bytes", key.bytes);
  // A round runs a block of every candidate, each round starting one candidate later, so that a
  // trend (the first calls of a process run slower for a dozen calls or more: pages touched
  // the first time, caches, the scheduler placing the ranks) falls on every candidate alike;
  // the first kWarmUpRounds rounds are not counted, nor the first call of a block.
  const size_t n = t->candidates.size();
  const size_t block = t->calls / kBlockCalls;
  const size_t round = block / n;
  const size_t k = (block % n + round) % n;
  pendingMeasured_ = round >= static_cast<size_t>(kWarmUpRounds) && t->calls % kBlockCalls != 0;
  pendingCandidate_ = k;
  pendingKey_ = key;
  ++t->calls;
  return t->candidates[k];
}

void AlgorithmTuner::record(int64_t elapsedNs) {
  Trial* t = pendingKey_ ? findTrial(*pendingKey_) : nullptr;
  if (t != nullptr && pendingMeasured_)
    t->times[pendingCandidate_].push_back(elapsedNs);
  pendingKey_.reset();
}

std::vector<int64_t> AlgorithmTuner::agreementVector(const Key& key) const {
  const Trial* t = findTrial(key);
  GS_CHECK(t != nullptr, Errc::kInternal, "no trial of an allreduce of %zu bytes", key.bytes);
  // [medians][ids][-ids]: after MAX over ranks, id == -(-id) in every slot exactly when every
  // rank tried the same candidates. Unused slots: median 0, id -1.
  std::vector<int64_t> v(kAgreementWords, 0);
  for (size_t k = 0; k < kMaxCandidates; ++k) {
    int64_t id = -1;
    if (k < t->candidates.size()) {
      std::vector<int64_t> times = t->times[k];
      if (!times.empty()) {
        std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
        v[k] = times[times.size() / 2];
      }
      id = static_cast<int64_t>(t->candidates[k]);
    }
    v[kMaxCandidates + k] = id;
    v[2 * kMaxCandidates + k] = -id;
  }
  return v;
}

AlgorithmTuner::Decision AlgorithmTuner::decide(const Key& key,
                                                const std::vector<int64_t>& maxOverRanks) {
  GS_CHECK(maxOverRanks.size() == kAgreementWords, Errc::kInternal,
           "%zu words agreed on for tuning (want %zu)", maxOverRanks.size(), kAgreementWords);
  Decision d;
  for (size_t k = 0; k < kMaxCandidates; ++k) {
    const int64_t id = maxOverRanks[kMaxCandidates + k];
    d.consistent = d.consistent && id == -maxOverRanks[2 * kMaxCandidates + k];
    if (id >= 0) {
      d.candidates.push_back(static_cast<stream::Algorithm>(id));
      d.slowestMedianNs.push_back(maxOverRanks[k]);
    }
  }
  GS_CHECK(!d.candidates.empty(), Errc::kInternal, "no candidate schedule agreed on");
  // Inconsistent (ranks priced the schedules differently, which their settings should have
  // prevented): the largest first id is the same number on every rank, so all still agree.
  size_t best = 0;
  if (d.consistent) {
    for (size_t k = 1; k < d.candidates.size(); ++k) {
      if (d.slowestMedianNs[k] < d.slowestMedianNs[best])
        best = k;
    }
    if (static_cast<double>(d.slowestMedianNs[0]) <=
        static_cast<double>(d.slowestMedianNs[best]) * kSwitchGain)
      best = 0;  // the model's choice, unless another is clearly faster
  }
  d.algorithm = d.candidates[best];
  trials_.erase(
      std::remove_if(trials_.begin(), trials_.end(), [&](const Trial& t) { return t.key == key; }),
      trials_.end());
  settled_.push_back({key, d.algorithm});
  return d;
}

std::string describeTrials(const AlgorithmTuner::Decision& d) {
  std::string out;
  for (size_t k = 0; k < d.candidates.size(); ++k) {
    out += formatString("%s%s %.1f us", k == 0 ? "" : ", ", stream::algorithmName(d.candidates[k]),
                        static_cast<double>(d.slowestMedianNs[k]) * 1e-3);
  }
  return out;
}

}  // namespace gs::control
