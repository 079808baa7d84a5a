#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace gs::control {

/// Tuning of one link's policy. Ladder rungs are indexes 0 (most precise, usually raw) to
/// rungs - 1 (the floor).
struct CodecPolicyConfig {
  int rungs = 1;
  int64_t chunkMinBytes = 256 << 10;
  int64_t chunkMaxBytes = 2 << 20;
  /// Relative L2 error of sampled chunks above which a rung (and every rung below it) is
  /// banned for errorHold.
  double errorBudget = 0.05;
  /// A less precise rung is kept only when it moves this many times the logical bytes per
  /// second of the rung above it: precision is worth something, and the margin is the hysteresis
  /// that keeps two rungs of similar speed from alternating.
  double gainMargin = 1.25;
  /// The margin grows with the measured noise: a comparison of two rungs needs a gain of
  /// 1 + noiseMargins x noise, up to maxMargin. Noise is the link's running mean of
  /// |ln(window goodput / its rung's estimate)| (one figure for every rung: what makes windows
  /// vary here, a shared CPU, is the same at every rung): on a shared 2-core host raw's windows
  /// vary by +-30 %, and a fixed 1.25 let raw and bf16 trade places on noise alone. Rungs are
  /// compared by their estimates (smoothed), a probe by its one window against the estimate.
  double noiseMargins = 3;
  double maxMargin = 2.5;
  /// A change of the current rung's goodput by this factor (either way; more where the rung's
  /// noise asks for it: 1 + 2 x noiseMargins x noise), in two windows in a row, means conditions
  /// changed: what was measured at other rungs is forgotten and probed again. One outlying window
  /// is neither a change nor part of the estimate.
  double changeFactor = 1.5;
  /// A rung, once chosen, stands at least this long before the policy moves again on its own
  /// (judging a probe and the error budget are not held back).
  std::chrono::nanoseconds minDwell = std::chrono::milliseconds(250);
  /// Observations are pooled until they cover this much busy time (one tiny collective says
  /// little about a link).
  std::chrono::nanoseconds minWindow = std::chrono::milliseconds(50);
  /// First wait before probing again in a direction where the last probe did not pay (and
  /// before re-checking the more precise rungs after stepping down); at least probeWindows
  /// observation windows, so probes cost a bounded share of the time. Doubles per failed probe
  /// up to maxProbeInterval; a change of conditions starts over.
  std::chrono::nanoseconds probeInterval = std::chrono::milliseconds(500);
  std::chrono::nanoseconds maxProbeInterval = std::chrono::seconds(16);
  double probeWindows = 3;
  std::chrono::nanoseconds errorHold = std::chrono::seconds(30);
  /// A figure measured longer ago than this is history when probing up: its rung counts as
  /// unmeasured. The link can change without the rung in use noticing (a recovery that comes
  /// while a rung never measured before is being tried), and a stale low figure for raw would
  /// otherwise keep the link compressed for good.
  std::chrono::nanoseconds estimateLifetime = std::chrono::seconds(2);
  /// The link is the bottleneck (worth compressing for) when ready chunks waited for the
  /// receiver's credits at least this share of the busy time, or the transport's rtt rose to
  /// rttInflation times its minimum; and the encoder is not (it took less than maxEncodeShare).
  double minCreditWaitShare = 0.05;
  double rttInflation = 2.0;
  double maxEncodeShare = 0.5;
  /// Chunk size: about this much wire time per chunk at the measured goodput, a power of two in
  /// [chunkMinBytes, chunkMaxBytes]; changed only when two windows in a row ask for it.
  double chunkSeconds = 0.002;
};

/// What the data path measured on one link since the last observation.
struct LinkObservation {
  std::chrono::steady_clock::time_point now;
  int rung = 0;               // the rung the chunks used
  uint64_t logicalBytes = 0;  // element bytes sent, before encoding
  uint64_t wireBytes = 0;
  double busySeconds = 0;        // time collectives ran on this link
  double creditWaitSeconds = 0;  // ready chunks waiting for a receive slot
  double encodeSeconds = 0;      // encoding chunks for this link
  double rttSeconds = 0;         // transport rtt now (0: unknown)
  uint64_t retransmits = 0;      // transport retransmissions since the last observation
  uint64_t congestionMarks = 0;  // RoCE ECN-marked packets + CNPs since the last observation
  int errorSamples = 0;          // sampled lossy chunks at `rung`
  double sampledError = 0;       // their mean relative L2 error
};

struct CodecDecision {
  int rung = 0;
  int64_t chunkBytes = 0;
  /// Why the rung changed ("probe down", "error budget", ...); nullptr when it did not.
  const char* reason = nullptr;
};

/// The codec-rung and chunk-size controller of one link: a hill climber on measured logical
/// goodput. It probes one rung down when the link, not the encoder, is the bottleneck; keeps the
/// rung only when it pays by gainMargin; probes up again when conditions change (the current
/// rung's goodput moves by changeFactor) or after a back-off; and moves up past any rung whose
/// sampled error exceeds the budget.
///
/// Pure: no clock, no I/O, all time from LinkObservation::now, so tests feed synthetic
/// sequences. Not thread-safe; one per link, used by the thread running collectives.
class CodecPolicy {
 public:
  CodecPolicy(const CodecPolicyConfig& config, int64_t initialChunkBytes);

  CodecDecision observe(const LinkObservation& obs);
  const CodecDecision& current() const { return decision_; }
  /// Logical bytes/s last measured at a rung (0: none).
  double estimate(int rung) const;
  bool banned(int rung, std::chrono::steady_clock::time_point now) const;

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Estimate {
    double goodput = 0;
    TimePoint at{};
    bool valid = false;
    int windows = 0;  // how many windows it pools
  };
  bool known(int rung) const { return estimates_[rung].valid; }
  /// Known from more than one window, and recently: a probe's single window carries the full
  /// noise, and an old figure may predate a change; neither is enough to move on without
  /// measuring again.
  bool settled(int rung, TimePoint now) const {
    return fresh(rung, now) && estimates_[rung].windows > 1;
  }
  bool fresh(int rung, TimePoint now) const {
    return known(rung) && now - estimates_[rung].at <= config_.estimateLifetime;
  }
  bool linkBound(const LinkObservation& window) const;
  /// The gain that makes one rung better than another (hysteresis plus the measured noise).
  double margin() const;
  /// Folds a window's goodput g at rung r into its estimate (starting the figures over when
  /// the window shows that conditions changed); true when it is an outlier, to be confirmed by
  /// the next window before anything is decided on it.
  bool foldWindow(int r, double g, TimePoint now);
  void moveTo(int rung, const char* why, TimePoint now);
  bool dwelt(TimePoint now) const { return now - movedAt_ >= config_.minDwell; }
  void decideRung(const LinkObservation& window);
  void decideChunk(const LinkObservation& window);
  std::chrono::nanoseconds backoff(int failures, double windowSeconds) const;

  CodecPolicyConfig config_;
  CodecDecision decision_;
  std::vector<Estimate> estimates_;
  double noise_ = 0;       // see CodecPolicyConfig::noiseMargins
  int pendingChange_ = 0;  // +1 / -1: the last window at the current rung was an outlier
  TimePoint movedAt_{};
  std::vector<TimePoint> bannedUntil_;
  LinkObservation window_{};
  bool windowOpen_ = false;
  double minRtt_ = 0;
  // Probe state: a probe moves from probeFrom_ to decision_.rung and is judged on the next window.
  bool probing_ = false;
  int probeFrom_ = 0;
  int downFailures_ = 0, upFailures_ = 0;
  TimePoint nextDown_{}, nextUp_{};
  int64_t proposedChunk_ = 0;
};

}  // namespace gs::control
