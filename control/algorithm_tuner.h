#pragma once

// GS_ALGO=auto, measured where the cost model is least sure (GS_ALGO_TUNE). For an allreduce
// size whose schedules the model prices close together, the next calls of that size run the
// close candidates in blocks of kBlockCalls consecutive calls of one candidate, in rounds that
// give each candidate a block: kWarmUpRounds rounds (links made at first use, caches), then
// kMeasuredRounds rounds whose times it keeps, all but each block's first call. Every rank then
// takes the same decision from the slowest rank's median per candidate, agreed by one small
// allreduce that the communicator runs before the next call of that size (agreementVector /
// decide), and keeps it for that size.
//
// Why: where a host's ranks outnumber its cores, the schedules' measured order at 32 KiB-1 MiB
// follows neither the model's latency nor its bandwidth terms (recursive doubling's two rounds
// of the whole buffer beat halving-doubling's four by up to 1.6x where the model prices them
// the other way; docs/PERFORMANCE.md §4), and a model fitted to one machine's noise would not
// carry to another. Measuring on the machine that runs the job does.
//
// Plain state; the communicator calls it under its execution lock, in call order, which is the
// same on every rank: every rank's tuner walks the same trials and decides at the same call.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "schedules/schedule.h"

namespace gs::control {

class AlgorithmTuner {
 public:
  /// Schedules priced within this factor of the cheapest are tried (at most kMaxCandidates).
  static constexpr double kCandidateFactor = 2.0;
  static constexpr size_t kMaxCandidates = 3;
  /// Calls in a row of one candidate. The first call after a switch pays for the switch (the
  /// previous schedule's credits and cache lines; over shm on crowded cores 2-5x a steady call)
  /// and is dropped: a candidate is timed as it would run once chosen. Measured on 2 cores,
  /// alternating every call ranked the schedules by chance over shm (docs/PERFORMANCE.md §10).
  static constexpr int kBlockCalls = 4;
  static constexpr int kWarmUpRounds = 1;
  static constexpr int kMeasuredRounds = 4;
  /// Times kept per candidate: the median of these decides.
  static constexpr int kMeasuredCalls = kMeasuredRounds * (kBlockCalls - 1);
  /// Smaller calls are left to the model: over shm up to 16 KiB they take the mailboxes whatever
  /// the schedule, and a few microseconds of difference drown in the machine's noise.
  static constexpr size_t kMinBytes = 32 << 10;
  /// The model's choice stays unless another candidate measured at least this much faster: a
  /// decision then changes only for a gain larger than run-to-run noise.
  static constexpr double kSwitchGain = 1.10;
  /// Sizes remembered (decided or in trial); the oldest is forgotten beyond, and re-tuned if it
  /// comes back.
  static constexpr size_t kRememberedSizes = 256;
  /// agreementVector's length: kMaxCandidates medians, ids and negated ids.
  static constexpr size_t kAgreementWords = 3 * kMaxCandidates;

  struct Key {
    size_t bytes = 0;
    const codecs::Codec* codec = nullptr;
    bool operator==(const Key& o) const { return bytes == o.bytes && codec == o.codec; }
  };

  /// What a decision was made of, for the log.
  struct Decision {
    stream::Algorithm algorithm = stream::Algorithm::kRing;
    std::vector<stream::Algorithm> candidates;
    std::vector<int64_t> slowestMedianNs;  // per candidate, the slowest rank's median
    bool consistent = true;                // every rank tried the same candidates
  };

  /// The decided schedule of `key`, if any.
  std::optional<stream::Algorithm> decided(const Key& key) const;
  /// Whether `key` is in trial.
  bool inTrial(const Key& key) const { return findTrial(key) != nullptr; }
  /// Starts trials of `candidates` (the model's order: the first is its choice; 2 or more).
  void begin(const Key& key, std::vector<stream::Algorithm> candidates);
  /// Whether every trial of `key` (in trial) ran: agree and decide before its next call.
  bool trialsDone(const Key& key) const;
  /// The schedule the next call of `key` (in trial, not done) runs; its time goes to record().
  stream::Algorithm nextTrial(const Key& key);
  /// This rank's time of the call nextTrial() chose (the warm-up round's are dropped).
  void record(int64_t elapsedNs);
  /// This rank's medians and candidates, to be reduced with MAX over all ranks.
  std::vector<int64_t> agreementVector(const Key& key) const;
  /// Decides from the MAX over ranks of agreementVector() (the same words on every rank, so
  /// every rank decides alike) and remembers the decision for `key`.
  Decision decide(const Key& key, const std::vector<int64_t>& maxOverRanks);

 private:
  struct Trial {
    Key key;
    std::vector<stream::Algorithm> candidates;
    std::vector<std::vector<int64_t>> times;  // per candidate, measured rounds only
    size_t calls = 0;                         // trial calls handed out
  };
  struct Settled {
    Key key;
    stream::Algorithm algorithm;
  };
  const Trial* findTrial(const Key& key) const;
  Trial* findTrial(const Key& key);
  size_t totalCalls(const Trial& t) const {
    return t.candidates.size() *
           static_cast<size_t>((kWarmUpRounds + kMeasuredRounds) * kBlockCalls);
  }

  std::deque<Trial> trials_;
  std::deque<Settled> settled_;
  // The call nextTrial() handed out, until record(): its size, candidate and whether it counts.
  std::optional<Key> pendingKey_;
  size_t pendingCandidate_ = 0;
  bool pendingMeasured_ = false;
};

/// "ring 372 us, halving_doubling 543 us" for the log.
std::string describeTrials(const AlgorithmTuner::Decision& d);

}  // namespace gs::control
