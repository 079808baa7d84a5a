#include "control/codec_policy.h"

#include <algorithm>
#include <cmath>

namespace gs::control {

CodecPolicy::CodecPolicy(const CodecPolicyConfig& config, int64_t initialChunkBytes)
    : config_(config) {
  config_.rungs = std::max(1, config_.rungs);
  decision_.chunkBytes = initialChunkBytes;
  estimates_.resize(config_.rungs);
  bannedUntil_.resize(config_.rungs);
  movedAt_ = TimePoint{} - config_.minDwell;  // the initial rung may be left at once
}

double CodecPolicy::estimate(int rung) const {
  return rung >= 0 && rung < config_.rungs && estimates_[rung].valid ? estimates_[rung].goodput : 0;
}

bool CodecPolicy::banned(int rung, TimePoint now) const {
  return now < bannedUntil_[rung];
}

std::chrono::nanoseconds CodecPolicy::backoff(int failures, double windowSeconds) const {
  const auto windows = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(config_.probeWindows * windowSeconds));
  auto wait = std::max(config_.probeInterval, windows);
  const auto most = std::max(config_.maxProbeInterval, windows);
  for (int i = 1; i < failures && wait < most; ++i)
    wait *= 2;
  return std::min(wait, most);
}

bool CodecPolicy::linkBound(const LinkObservation& w) const {
  if (w.busySeconds <= 0 || w.encodeSeconds > config_.maxEncodeShare * w.busySeconds)
    return false;  // the encoder already takes most of the time: fewer bytes will not help
  const bool waitsForReceiver = w.creditWaitSeconds >= config_.minCreditWaitShare * w.busySeconds;
  const bool queueing = minRtt_ > 0 && w.rttSeconds >= config_.rttInflation * minRtt_;
  return waitsForReceiver || queueing || w.retransmits > 0 || w.congestionMarks > 0;
}

double CodecPolicy::margin() const {
  return std::clamp(1 + config_.noiseMargins * noise_, config_.gainMargin,
                    std::max(config_.gainMargin, config_.maxMargin));
}

bool CodecPolicy::foldWindow(int r, double g, TimePoint now) {
  Estimate& e = estimates_[r];
  const double deviation = e.valid ? std::abs(std::log(g / e.goodput)) : 0;
  const double threshold =
      std::max(std::log(config_.changeFactor), std::log1p(2 * config_.noiseMargins * noise_));
  const int direction = deviation <= threshold ? 0 : g > e.goodput ? 1 : -1;
  // Two windows in a row off the estimate: the link changed. So does one off a figure too old to
  // pool with, at the rung the policy stays on: long windows (64 MiB at 0.5 Gbit/s take 1 s)
  // outlive the estimate while the first one is being confirmed, and a back-off grown on the
  // fast link would otherwise hold the rung for up to 16 s after a rate cut. (A probe's old
  // figure is just replaced: it may come from other conditions, and resetting every back-off on
  // it would have the policy probe again at once.)
  const bool probe = probing_ && r == decision_.rung;
  if (direction != 0 && (direction == pendingChange_ || (!fresh(r, now) && !probe))) {
    // Every other figure is history, and probing starts over without back-off.
    for (Estimate& k : estimates_)
      k.valid = false;
    downFailures_ = upFailures_ = 0;
    nextDown_ = nextUp_ = now;
    probing_ = false;
  }
  if (!fresh(r, now)) {
    // No figure (or just dropped), or one too old to pool with: this window starts it over.
    e = Estimate{g, now, true, 1};
    pendingChange_ = 0;
    return false;
  }
  pendingChange_ = direction;
  if (direction != 0)
    return true;  // an outlier: wait for the next window before believing it
  noise_ = 0.8 * noise_ + 0.2 * deviation;
  e = Estimate{0.5 * e.goodput + 0.5 * g, now, true, e.windows + 1};
  return false;
}

void CodecPolicy::moveTo(int rung, const char* why, TimePoint now) {
  if (rung == decision_.rung)
    return;
  decision_.rung = rung;
  decision_.reason = why;
  movedAt_ = now;
  pendingChange_ = 0;
}

CodecDecision CodecPolicy::observe(const LinkObservation& obs) {
  decision_.reason = nullptr;
  if (obs.rttSeconds > 0)
    minRtt_ = minRtt_ > 0 ? std::min(minRtt_, obs.rttSeconds) : obs.rttSeconds;
  // Pool observations of one rung until they cover minWindow of busy time.
  if (!windowOpen_ || window_.rung != obs.rung) {
    window_ = obs;
    windowOpen_ = true;
  } else {
    const int samples = window_.errorSamples + obs.errorSamples;
    if (samples > 0) {
      window_.sampledError =
          (window_.sampledError * window_.errorSamples + obs.sampledError * obs.errorSamples) /
          samples;
    }
    window_.errorSamples = samples;
    window_.now = obs.now;
    window_.logicalBytes += obs.logicalBytes;
    window_.wireBytes += obs.wireBytes;
    window_.busySeconds += obs.busySeconds;
    window_.creditWaitSeconds += obs.creditWaitSeconds;
    window_.encodeSeconds += obs.encodeSeconds;
    window_.retransmits += obs.retransmits;
    window_.congestionMarks += obs.congestionMarks;
    if (obs.rttSeconds > 0)
      window_.rttSeconds = obs.rttSeconds;
  }
  if (window_.busySeconds < std::chrono::duration<double>(config_.minWindow).count())
    return decision_;
  windowOpen_ = false;
  if (window_.logicalBytes == 0)
    return decision_;
  decideRung(window_);
  decideChunk(window_);
  return decision_;
}

void CodecPolicy::decideRung(const LinkObservation& w) {
  const TimePoint now = w.now;
  const int r = std::clamp(w.rung, 0, config_.rungs - 1);
  const double g = static_cast<double>(w.logicalBytes) / w.busySeconds;
  const double span = w.busySeconds;

  const bool outlier = foldWindow(r, g, now);

  // Numerics guardrail: past the budget this rung and every less precise one are off limits.
  if (w.errorSamples > 0 && w.sampledError > config_.errorBudget) {
    for (int k = r; k < config_.rungs; ++k)
      bannedUntil_[k] = now + config_.errorHold;
  }
  int cur = decision_.rung;
  if (banned(cur, now)) {
    while (cur > 0 && banned(cur, now))
      --cur;
    probing_ = false;
    moveTo(cur, "error budget", now);
    return;
  }
  if (r != cur || outlier)
    return;  // a rung no longer chosen (a decision arrived mid-window), or one odd window

  // Back-off: downFailures_ / upFailures_ count the moves down / up that were undone (a probe
  // that did not pay, or a later move the other way). Only a change of conditions clears them,
  // so a pair of rungs near the margin is revisited ever less often instead of alternating. A
  // probe kept asks for a look the other way soon (the first back-off step), as it did before.
  if (probing_) {
    probing_ = false;
    const double before = estimate(probeFrom_);
    if (cur > probeFrom_) {
      if (g > before * margin()) {
        // Compression pays: keep it, go on down if the link still holds us back, and re-check
        // the precise rungs only later.
        // A probe back up costs a window at the precise rung, longer than this one by the
        // goodputs' ratio (4x from fp8 to raw on a congested link): wait in proportion.
        nextDown_ = now;
        nextUp_ = now + backoff(1, span * g / std::max(before, g * 1e-3));
        movedAt_ = now;  // the kept rung's dwell starts with the decision to keep it
        return;
      }
      nextDown_ = now + backoff(++downFailures_, span);
      moveTo(probeFrom_, "less precision did not pay", now);
    } else {
      // Kept only inside the half-margin band, as "precision is cheap" below: a pair of rungs
      // whose gain sits near the margin stays where it is instead of passing both verdicts.
      if (before > g * (1 + (margin() - 1) / 2)) {
        nextUp_ = now + backoff(++upFailures_, span);
        moveTo(probeFrom_, "more precision cost too much", now);
        return;
      }
      // Precision is back at little cost: keep it, and try for more.
      nextUp_ = now;
      nextDown_ = now + backoff(downFailures_ + 1, span);
      movedAt_ = now;
    }
    return;
  }
  if (!dwelt(now))
    return;  // the last decision stands a while: noise must not undo it

  // Up. A more precise rung known to be about as fast wins outright: the compressed rung's gain
  // fell below half the margin it needed to be chosen (a band, so estimates near the margin do
  // not move the rung both ways).
  const double m = margin();
  if (cur > 0 && !banned(cur - 1, now) && settled(cur - 1, now) && now >= nextUp_ &&
      estimate(cur) < estimate(cur - 1) * (1 + (m - 1) / 2)) {
    nextDown_ = std::max(nextDown_, now + backoff(++downFailures_, span));
    moveTo(cur - 1, "precision is cheap", now);
    return;
  }
  // Probe the most precise rung with no current figure first: the ladder need not be monotone
  // (bf16 can be slower than raw where the CPU, not the link, is the bottleneck).
  if (cur > 0 && now >= nextUp_) {
    int target = cur - 1;
    for (int k = cur - 1; k >= 0; --k) {
      if (!banned(k, now) && !fresh(k, now))
        target = k;
    }
    if (!banned(target, now)) {
      probing_ = true;
      probeFrom_ = cur;
      moveTo(target, "probe up", now);
      return;
    }
  }
  // Down, only while the link (not the encoder) holds the transfer back.
  const int next = cur + 1;
  if (next < config_.rungs && !banned(next, now) && now >= nextDown_) {
    if (settled(next, now) && estimate(next) > estimate(cur) * m) {
      nextUp_ = std::max(nextUp_, now + backoff(++upFailures_, span));
      moveTo(next, "compression pays", now);
    } else if (linkBound(w)) {
      probing_ = true;
      probeFrom_ = cur;
      moveTo(next, "probe down", now);
    }
  }
}

void CodecPolicy::decideChunk(const LinkObservation& w) {
  const double logicalPerSecond = static_cast<double>(w.logicalBytes) / w.busySeconds;
  const double want = std::clamp(logicalPerSecond * config_.chunkSeconds,
                                 static_cast<double>(config_.chunkMinBytes),
                                 static_cast<double>(config_.chunkMaxBytes));
  // Largest power of two not above want, but never below the minimum.
  int64_t chunk = int64_t{1} << static_cast<int>(std::floor(std::log2(want)));
  chunk = std::clamp(chunk, config_.chunkMinBytes, config_.chunkMaxBytes);
  if (chunk != decision_.chunkBytes && chunk == proposedChunk_)
    decision_.chunkBytes = chunk;
  proposedChunk_ = chunk;
}

}  // namespace gs::control
