#include "schedules/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace gs::stream {
namespace {

double log2Ceil(int n) {
  int rounds = 0;
  while ((1 << rounds) < n)
    ++rounds;
  return rounds;
}

int powerOfTwoBelow(int n) {
  int p = 1;
  while (p * 2 <= n)
    p *= 2;
  return p;
}

// Ranks outnumbering cores (see predictAllReduceSeconds): how much longer a phase takes in
// which the ranks `working` (per rank) work at once, moving messages of `message` bytes over
// `link`: (working / cores)^2 on the most crowded host, 1 where no host is crowded or its
// cores are not known.
double crowding(const Topology& t,
                const std::vector<bool>& working,
                double message,
                const LinkCost& link) {
  if (message < link.crowdedFromBytes)
    return 1;
  std::vector<int> onHost(static_cast<size_t>(t.hosts()), 0);
  for (int r = 0; r < t.nranks(); ++r)
    onHost[t.hostOf[r]] += working[r] ? 1 : 0;
  double worst = 1;
  for (int h = 0; h < t.hosts(); ++h) {
    const int cores = t.coresOn(h);
    if (cores > 0 && onHost[h] > cores) {
      const double ratio = static_cast<double>(onHost[h]) / cores;
      worst = std::max(worst, ratio * ratio);
    }
  }
  return worst;
}

// The crowding of halving-doubling and recursive doubling over all ranks (schedule_hd.cc):
// with n = P + R, members 2j and 2j+1 (j < R) fold, the even one handing its buffer to the odd
// one; the P others run the rounds. `round` and `fold` are the phases' largest messages.
struct DoublingCrowding {
  double rounds = 1, fold = 1;
};
DoublingCrowding doublingCrowding(const Topology& t,
                                  double round,
                                  double fold,
                                  const LinkCost& link) {
  const int n = t.nranks();
  const int folded = n - powerOfTwoBelow(n);
  std::vector<bool> inRounds(n, true), inFold(n, false);
  for (int r = 0; r < 2 * folded; ++r) {
    inRounds[r] = r % 2 == 1;
    inFold[r] = true;
  }
  return {crowding(t, inRounds, round, link), folded > 0 ? crowding(t, inFold, fold, link) : 1};
}

// Halving-doubling of `bytes` among g members over links `link`: log2(P) rounds each way, the
// halving moving (P-1)/P of the data (encoded) and the doubling as much (raw), plus the fold
// of the members beyond P (a whole-buffer hop in and out); each phase times its crowding.
double halvingDoubling(
    int g, double bytes, const LinkCost& link, const CostModel& m, DoublingCrowding crowd = {}) {
  if (g <= 1)
    return 0;
  const int p = powerOfTwoBelow(g);
  const double rounds = 2 * std::log2(p);
  const double share = (p - 1.0) / p * bytes;
  double t = crowd.rounds *
             (rounds * link.alphaSeconds + share * (m.codecRatio + 1.0) * link.betaSecondsPerByte +
              share * m.gammaSecondsPerByte);
  if (p != g)
    t += crowd.fold *
         (2 * link.alphaSeconds + bytes * (m.codecRatio + 1.0) * link.betaSecondsPerByte +
          bytes * m.gammaSecondsPerByte);
  return t;
}

// Recursive doubling of `bytes` among g members: log2(P) rounds each moving and reducing the
// whole buffer, raw, plus the same fold as halving-doubling's.
double recursiveDoubling(
    int g, double bytes, const LinkCost& link, const CostModel& m, DoublingCrowding crowd) {
  if (g <= 1)
    return 0;
  const int p = powerOfTwoBelow(g);
  double t = crowd.rounds * std::log2(p) *
             (link.alphaSeconds + bytes * link.betaSecondsPerByte + bytes * m.gammaSecondsPerByte);
  if (p != g)
    t += crowd.fold *
         (2 * link.alphaSeconds + bytes * (m.codecRatio + 1.0) * link.betaSecondsPerByte +
          bytes * m.gammaSecondsPerByte);
  return t;
}

// Two ranks, raw: the ring is halving-doubling's two rounds of halves (the same moves, priced
// alike; ties go to the ring), and up to kExchangeMaxBytes the engine runs it as one exchange
// of the whole buffer, priced as those two rounds less one round's latency: measured, the
// exchange's extra reduction costs no more than the round it saves up to that size
// (schedule.h). Recursive doubling at two ranks is that exchange too.
double twoRanksUncompressed(double bytes, const LinkCost& link, const CostModel& m) {
  const double halves = halvingDoubling(2, bytes, link, m);
  return bytes <= static_cast<double>(kExchangeMaxBytes) ? halves - link.alphaSeconds : halves;
}

// Pipelined ring phase over g members: (g-1) rounds of bytes/g, each hop able to start after
// one chunk of the previous one.
double ringPhase(int g, double bytes, double wireRatio, const LinkCost& link, const CostModel& m) {
  if (g <= 1)
    return 0;
  const double block = bytes / g;
  const double chunk = std::min(block, m.chunkBytes) * wireRatio;
  return (g - 1) * (link.alphaSeconds + chunk * link.betaSecondsPerByte) +
         (g - 1) * block * wireRatio * link.betaSecondsPerByte;
}

}  // namespace

LinkCost CostModel::measured(const std::string& transport) {
  // gradstream-perf, 2 ranks, median of quiet runs (bench/README.md): latency from 8 B
  // allreduces (one exchange), bandwidth from 64 MiB ones.
  // shm: 8 B in 1.5 us, 2-64 MiB at 4-6 GB/s busbw; an allreduce's chunks of 1 MiB and more
  // take the single copy (Engine::Run::kAllReduceSingleCopyMinBytes), which its receiver reads.
  // A reduce's pieces: 128 KiB over shm (a 2-rank 512 KiB / 1 MiB reduce 28 / 49-53 us against
  // 31 / 51-53 with 256 KiB), 256 KiB over tcp, where each piece is a socket write and read
  // (1 MiB: 181-192 us against 215-286 in eight pieces of 128 KiB; OpenMPI ~200).
  if (transport == "shm")
    return LinkCost{1e-6, 1.0 / 5.0e9, static_cast<double>(1 << 20), 128 << 10};
  if (transport == "loopback")
    return LinkCost{2e-6, 1.0 / 6.0e9, 0, 128 << 10};
  if (transport == "verbs")
    return LinkCost{3e-6, 1.0 / 12.0e9, 0, 256 << 10};
  // tcp over loopback: 8 B in 12 us, 4 MiB at 2 GB/s
  return LinkCost{12e-6, 1.0 / 2.0e9, 0, 256 << 10};
}

double predictAllReduceSeconds(Algorithm algo,
                               const Topology& topology,
                               double bytes,
                               const CostModel& m) {
  const int n = topology.nranks();
  if (n <= 1)
    return 0;
  const int hosts = topology.hosts();
  const int perHost = topology.maxPerHost();
  // A flat algorithm runs at the pace of its slowest link: inter-host once there are hosts.
  const LinkCost& slow = hosts > 1 ? m.interHost : m.intraHost;
  const double reduce = bytes * m.gammaSecondsPerByte;
  const std::vector<bool> everyRank(n, true);
  // The largest message of a phase: a block of `bytes / parts`, cut into chunks, encoded.
  const auto message = [&](double parts, double ratio) {
    return std::min(bytes / parts, m.chunkBytes) * ratio;
  };
  switch (algo) {
    case Algorithm::kRing: {
      const double crowd = crowding(topology, everyRank, message(n, m.codecRatio), slow);
      if (n == 2 && m.codecRatio == 1.0)
        return crowd * twoRanksUncompressed(bytes, slow, m);
      return crowd * (ringPhase(n, bytes, m.codecRatio, slow, m) +
                      ringPhase(n, bytes, m.codecRatio, slow, m) + (n - 1.0) / n * reduce);
    }
    case Algorithm::kTree: {
      // Each half climbs and descends a tree of depth ~log2(N)+1; a rank sends up to 3 halves
      // per tree where it is inner, about the buffer per direction in total; the pipeline fills
      // one chunk per level.
      const double depth = log2Ceil(n) + 1;
      const double chunk = message(2, m.codecRatio);
      return crowding(topology, everyRank, chunk, slow) *
             (2 * depth * (slow.alphaSeconds + chunk * slow.betaSecondsPerByte) +
              1.5 * bytes * m.codecRatio * slow.betaSecondsPerByte + reduce);
    }
    case Algorithm::kHalvingDoubling:
      return halvingDoubling(
          n, bytes, slow, m,
          doublingCrowding(topology, message(2, m.codecRatio), message(1, m.codecRatio), slow));
    case Algorithm::kRecursiveDoubling:
      // Its rounds travel raw: a call with a codec asked for compression, which the others give.
      if (m.codecRatio != 1.0)
        return std::numeric_limits<double>::infinity();
      if (n == 2 && bytes <= static_cast<double>(kExchangeMaxBytes))  // the ring's exchange
        return crowding(topology, everyRank, bytes, slow) * twoRanksUncompressed(bytes, slow, m);
      return recursiveDoubling(n, bytes, slow, m,
                               doublingCrowding(topology, message(1, 1), message(1, 1), slow));
    case Algorithm::kHierarchical: {
      if (!topology.uniform())
        return std::numeric_limits<double>::infinity();
      // Intra-host phases travel raw; the cross-host allreduce moves one shard per rank. Every
      // rank works in every phase.
      const double intra = crowding(topology, everyRank, message(perHost, 1), m.intraHost);
      const double shard = bytes / perHost;
      const double inter = crowding(topology, everyRank,
                                    std::min(shard / 2, m.chunkBytes) * m.codecRatio, m.interHost);
      return intra * (ringPhase(perHost, bytes, 1.0, m.intraHost, m) +
                      ringPhase(perHost, bytes, 1.0, m.intraHost, m) +
                      (perHost - 1.0) / perHost * reduce) +
             inter * halvingDoubling(hosts, shard, m.interHost, m);
    }
  }
  return std::numeric_limits<double>::infinity();
}

Algorithm cheapestAllReduce(const Topology& topology, double bytes, const CostModel& model) {
  Algorithm best = Algorithm::kRing;
  double bestTime = std::numeric_limits<double>::infinity();
  for (Algorithm a : kAlgorithms) {
    const double t = predictAllReduceSeconds(a, topology, bytes, model);
    if (t < bestTime) {
      bestTime = t;
      best = a;
    }
  }
  return best;
}

double predictReduceSeconds(ReduceAlgorithm algo,
                            const Topology& topology,
                            double bytes,
                            const CostModel& m) {
  const int n = topology.nranks();
  if (n <= 1 || bytes <= 0)
    return 0;
  const LinkCost& link = topology.hosts() > 1 ? m.interHost : m.intraHost;
  const double chunk =
      std::min(bytes, static_cast<double>(reduceChunkBytes(
                          topology, static_cast<size_t>(bytes), static_cast<size_t>(m.chunkBytes),
                          static_cast<size_t>(link.reducePieceBytes)))) *
      m.codecRatio;
  const double wire = bytes * m.codecRatio * link.betaSecondsPerByte;
  if (algo == ReduceAlgorithm::kChain) {
    // A message per hop; a chunk fills each hop before the root's (N = 2: one message, as the
    // tree), then the buffer streams into the root once.
    return (n - 1) * link.alphaSeconds + (n - 2) * chunk * link.betaSecondsPerByte + wire +
           bytes * m.gammaSecondsPerByte;
  }
  if (algo == ReduceAlgorithm::kLinear) {
    // One round: every other rank's buffer crosses into the root at once (its inbound link
    // carries them one after the other) and the root reduces them all. The latency of one
    // message, plus the root's own handling of each further message, taken as a quarter of
    // alpha (alpha is both ends' overhead and the wire's latency; the root's share of one end
    // is what serializes; an estimate, not a measurement).
    return link.alphaSeconds * (1 + (n - 2) / 4.0) +
           (n - 1) * (wire + bytes * m.gammaSecondsPerByte);
  }
  // Each round's whole buffer reaches the root one after the other (its link is the busiest).
  const double rounds = log2Ceil(n);
  return rounds * (link.alphaSeconds + wire + bytes * m.gammaSecondsPerByte);
}

ReduceAlgorithm cheapestReduce(const Topology& topology, double bytes, const CostModel& model) {
  ReduceAlgorithm best = ReduceAlgorithm::kChain;
  double bestTime = predictReduceSeconds(best, topology, bytes, model);
  for (ReduceAlgorithm a : {ReduceAlgorithm::kTree, ReduceAlgorithm::kLinear}) {
    const double t = predictReduceSeconds(a, topology, bytes, model);
    if (t < bestTime) {
      bestTime = t;
      best = a;
    }
  }
  return best;
}

}  // namespace gs::stream
