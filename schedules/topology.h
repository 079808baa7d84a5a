#pragma once

#include <string>
#include <vector>

namespace gs::stream {

/// Which host each rank runs on, as the rendezvous saw it (hostnames, or GS_HOSTNAME). Hosts
/// are numbered densely in order of their lowest rank. Plain value; safe to copy and share.
struct Topology {
  std::vector<int> hostOf;  // per rank
  /// Per host: the CPUs its ranks may run on, together (0 or absent: not known). Ranks
  /// outnumbering them slow some schedules down more than others (cost_model.h).
  std::vector<int> coresOf;

  /// Groups ranks by name: ranks with equal names share a host.
  static Topology fromHostNames(const std::vector<std::string>& names);
  /// nranks ranks, perHost consecutive ranks per host (the last host may have fewer).
  static Topology blocks(int nranks, int perHost);

  int nranks() const { return static_cast<int>(hostOf.size()); }
  int hosts() const;
  /// The ranks of one host, ascending (local rank = position in this list).
  std::vector<int> ranksOn(int host) const;
  /// Position of rank among the ranks of its host.
  int localRank(int rank) const;
  /// Ranks on the most populated host.
  int maxPerHost() const;
  /// Every host has the same number of ranks.
  bool uniform() const;
  /// The CPUs of `host` (coresOf), 0 when not known.
  int coresOn(int host) const;
  /// Some host has more ranks than CPUs (known ones only). Every rank sees the same.
  bool crowded() const;
};

}  // namespace gs::stream
