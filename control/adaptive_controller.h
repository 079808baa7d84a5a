#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "common/config.h"
#include "control/codec_policy.h"
#include "monitoring/metrics.h"
#include "stream/engine.h"
#include "stream/link.h"

namespace gs::control {

/// The rungs codec=auto may use: Config::codecLadder cut after Config::codecFloor. Entries are
/// codec specs separated by commas, a spec's own options following it ("raw,bf16,int4,sr").
/// Throws kInvalidArgument naming GS_CODEC_LADDER / GS_CODEC_FLOOR.
std::vector<codecs::CodecSpec> parseCodecLadder(const std::string& ladder,
                                                const std::string& floor);

/// codec=auto for one communicator: after every adaptive collective it turns the per-link
/// counters (monitoring snapshots) and the transport's link info into observations, runs each
/// link's CodecPolicy, hands the chosen codec to the engine (Engine::setLinkCodec) and publishes
/// the choice and the sampled error as metrics.
///
/// Owned by the communicator; called only by the thread running collectives (under its
/// execution lock). Owns the codecs of the ladder, which the engine points at.
class AdaptiveController {
 public:
  using Clock = std::chrono::steady_clock;

  AdaptiveController(const Config& config, const std::vector<int>& peers);

  /// Before an adaptive collective: the counters it will be measured against.
  void begin(const monitoring::Metrics& metrics);
  /// After it: decide and apply.
  void end(stream::Engine& engine,
           monitoring::Metrics& metrics,
           const std::vector<stream::Link*>& linksByPeer,
           Clock::time_point now);
  /// Sets every link to its current rung (at start-up).
  void apply(stream::Engine& engine, monitoring::Metrics& metrics);

  int rungs() const { return static_cast<int>(ladder_.size()); }
  const codecs::CodecSpec& rung(int i) const { return ladder_[i]; }
  /// Current rung of the link to peer (-1: no such link).
  int rungOf(int peer) const;
  /// The chunk size this rank proposes for its links: the smallest of its policies' decisions
  /// (0: none yet). Ranks agree on the minimum of all proposals (Communicator).
  int64_t proposedChunkBytes() const;

 private:
  struct LinkState {
    int peer;
    CodecPolicy policy;
    monitoring::LinkSnapshot before;
    uint64_t retransmits = 0;
    uint64_t congestionMarks = 0;  // ECN marks + CNPs last seen (port totals)
  };
  const codecs::Codec* codecOf(int rung) const { return codecs_[rung].get(); }

  std::vector<codecs::CodecSpec> ladder_;
  std::vector<std::unique_ptr<codecs::Codec>> codecs_;  // per rung; null for raw
  std::vector<LinkState> links_;
};

}  // namespace gs::control
