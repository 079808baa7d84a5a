#include "control/adaptive_controller.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"
#include "common/log.h"

namespace gs::control {
namespace {

bool isOption(const std::string& token) {
  return token == "sr" || token.rfind("block=", 0) == 0;
}

std::string lower(std::string s) {
  std::string out;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c)))
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

}  // namespace

std::vector<codecs::CodecSpec> parseCodecLadder(const std::string& ladder,
                                                const std::string& floor) {
  // Split at commas, then glue options back to the spec they follow.
  std::vector<std::string> entries;
  const std::string text = lower(ladder);
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string token = text.substr(begin, comma - begin);
    GS_CHECK(!token.empty(), Errc::kInvalidArgument, "GS_CODEC_LADDER='%s' has an empty entry",
             ladder.c_str());
    if (isOption(token)) {
      GS_CHECK(!entries.empty(), Errc::kInvalidArgument,
               "GS_CODEC_LADDER='%s' starts with an option", ladder.c_str());
      entries.back() += "," + token;
    } else {
      entries.push_back(token);
    }
    begin = comma + 1;
  }
  std::vector<codecs::CodecSpec> out;
  for (const std::string& e : entries) {
    GS_CHECK(e != "auto", Errc::kInvalidArgument, "GS_CODEC_LADDER cannot contain 'auto'");
    out.push_back(codecs::CodecSpec::parse(e));
  }
  GS_CHECK(!out.empty(), Errc::kInvalidArgument, "GS_CODEC_LADDER is empty");
  if (floor.empty())
    return out;
  const format::CodecId floorId = codecs::CodecSpec::parse(floor).id;
  auto it = std::find_if(out.begin(), out.end(),
                         [&](const codecs::CodecSpec& s) { return s.id == floorId; });
  GS_CHECK(it != out.end(), Errc::kInvalidArgument,
           "GS_CODEC_FLOOR='%s' is not a rung of GS_CODEC_LADDER='%s'", floor.c_str(),
           ladder.c_str());
  out.erase(it + 1, out.end());
  return out;
}

AdaptiveController::AdaptiveController(const Config& config, const std::vector<int>& peers)
    : ladder_(parseCodecLadder(config.codecLadder, config.codecFloor)) {
  for (const codecs::CodecSpec& spec : ladder_)
    codecs_.push_back(spec.id == format::CodecId::kRaw ? nullptr : codecs::makeCodec(spec));
  CodecPolicyConfig pc;
  pc.rungs = rungs();
  pc.chunkMinBytes = config.chunkMinBytes;
  pc.chunkMaxBytes = config.chunkMaxBytes;
  pc.errorBudget = config.errorBudget;
  for (int peer : peers)
    links_.push_back({peer, CodecPolicy(pc, config.chunkBytes), {}, 0});
}

int AdaptiveController::rungOf(int peer) const {
  for (const LinkState& l : links_) {
    if (l.peer == peer)
      return l.policy.current().rung;
  }
  return -1;
}

int64_t AdaptiveController::proposedChunkBytes() const {
  int64_t best = 0;
  for (const LinkState& l : links_) {
    const int64_t c = l.policy.current().chunkBytes;
    if (c > 0 && (best == 0 || c < best))
      best = c;
  }
  return best;
}

void AdaptiveController::apply(stream::Engine& engine, monitoring::Metrics& metrics) {
  for (const LinkState& l : links_) {
    const int rung = l.policy.current().rung;
    engine.setLinkCodec(l.peer, codecOf(rung));
    if (monitoring::LinkCounters* c = metrics.link(l.peer))
      c->setCodecRung(static_cast<int>(ladder_[rung].id));
  }
}

void AdaptiveController::begin(const monitoring::Metrics& metrics) {
  const monitoring::Snapshot snap = metrics.snapshot();
  for (LinkState& l : links_) {
    if (const monitoring::LinkSnapshot* s = snap.link(l.peer))
      l.before = *s;
  }
}

void AdaptiveController::end(stream::Engine& engine,
                             monitoring::Metrics& metrics,
                             const std::vector<stream::Link*>& linksByPeer,
                             Clock::time_point now) {
  const monitoring::Snapshot snap = metrics.snapshot();
  for (LinkState& l : links_) {
    const monitoring::LinkSnapshot* s = snap.link(l.peer);
    if (s == nullptr)
      continue;
    const monitoring::LinkSnapshot& b = l.before;
    const int rung = l.policy.current().rung;
    const int codecId = static_cast<int>(ladder_[rung].id);
    LinkObservation o;
    o.now = now;
    o.rung = rung;
    o.logicalBytes = s->bytesLogical - b.bytesLogical;
    o.wireBytes = s->bytesWire - b.bytesWire;
    o.busySeconds = static_cast<double>(s->busyNs - b.busyNs) * 1e-9;
    o.creditWaitSeconds = static_cast<double>(s->creditWaitNs - b.creditWaitNs) * 1e-9;
    o.encodeSeconds = static_cast<double>(s->encodeNs - b.encodeNs) * 1e-9;
    const uint64_t samples = s->errorSamples[codecId] - b.errorSamples[codecId];
    if (samples > 0) {
      o.errorSamples = static_cast<int>(samples);
      o.sampledError = (s->errorSum[codecId] - b.errorSum[codecId]) / static_cast<double>(samples);
      metrics.setCompressionError(codecId, o.sampledError);
    }
    monitoring::LinkCounters* counters = metrics.link(l.peer);
    stream::Link* link = static_cast<size_t>(l.peer) < linksByPeer.size()
                             ? linksByPeer[static_cast<size_t>(l.peer)]
                             : nullptr;
    transport::LinkInfo info;
    if (link != nullptr && link->connected() && link->connection().linkInfo(&info)) {
      o.rttSeconds = info.rttSeconds;
      o.retransmits = info.retransmits >= l.retransmits ? info.retransmits - l.retransmits : 0;
      l.retransmits = info.retransmits;
      const uint64_t marks = info.ecnMarked + info.cnpReceived;
      o.congestionMarks = marks >= l.congestionMarks ? marks - l.congestionMarks : 0;
      l.congestionMarks = marks;
      if (counters != nullptr) {
        counters->transportRttSeconds.store(info.rttSeconds, std::memory_order_relaxed);
        counters->transportRttVarSeconds.store(info.rttVarSeconds, std::memory_order_relaxed);
        counters->transportRetransmits.store(info.retransmits, std::memory_order_relaxed);
        counters->transportCwndBytes.store(info.cwndBytes, std::memory_order_relaxed);
      }
    }
    const CodecDecision d = l.policy.observe(o);
    if (d.rung != rung) {
      // t= is steady (CLOCK_MONOTONIC) seconds: tests line decisions up with rate changes.
      GS_LOG_INFO("link to rank %d: %s -> %s (%s; %.3g GB/s at %s) t=%.3f", l.peer,
                  ladder_[rung].name().c_str(), ladder_[d.rung].name().c_str(), d.reason,
                  l.policy.estimate(rung) * 1e-9, ladder_[rung].name().c_str(),
                  std::chrono::duration<double>(now.time_since_epoch()).count());
      engine.setLinkCodec(l.peer, codecOf(d.rung));
      if (counters != nullptr)
        counters->setCodecRung(static_cast<int>(ladder_[d.rung].id));
    }
  }
}

}  // namespace gs::control
