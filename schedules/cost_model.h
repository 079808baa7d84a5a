#pragma once

#include <string>

#include "schedules/schedule.h"
#include "schedules/topology.h"

namespace gs::stream {

/// Cost of moving one message over one class of link: alpha + bytes * beta (Hockney).
struct LinkCost {
  double alphaSeconds = 20e-6;
  double betaSecondsPerByte = 1e-9;  // 1 / bandwidth
  /// Messages from this size on need their receiver to run while they move, so ranks
  /// outnumbering cores slow them down (predictAllReduceSeconds). shm: the single copy, from
  /// 1 MiB chunks, which the receiver reads out of the sender's memory; smaller chunks are
  /// left in the receiver's slots without it. 0: every message (tcp: the kernel copies at both
  /// ends).
  double crowdedFromBytes = 0;
  /// The smallest piece a pipelined reduce cuts its buffer into over this link
  /// (reduceChunkBytes): below it a piece's per-message cost outweighs the overlap it buys.
  double reducePieceBytes = 128 << 10;
};

/// The alpha-beta-gamma model the algorithm choice and the simulator (tools/sim) share.
/// Plain value.
struct CostModel {
  LinkCost intraHost;  // ranks on one host (shm, or loopback tcp without it)
  LinkCost interHost;
  double gammaSecondsPerByte = 0.12e-9;  // reduce a[i] += b[i], bytes of one operand
  double chunkBytes = 1 << 20;           // pipeline unit: a hop forwards after one chunk
  /// Wire bytes per logical byte of the codec in use (1 raw, ~0.5 bf16, ~0.27 int8).
  double codecRatio = 1.0;

  /// Defaults measured on the reference machine (bench/README.md): tcp over loopback or a
  /// veth pair, shm between processes of one host, loopback between threads.
  static LinkCost measured(const std::string& transport);
};

/// Predicted seconds of one allreduce of `bytes` with `algo` on `topology`: closed forms of the
/// schedules in schedule.h (rounds on the critical path times alpha, bytes on the busiest link
/// times beta, bytes reduced times gamma, plus the pipeline fill of a chunk per round).
/// Where a host's ranks outnumber its cores (Topology::coresOf), a phase in which more of its
/// ranks work at once than it has cores takes (working / cores)^2 as long, unless its messages
/// are below the link's crowdedFromBytes: each rank has a share of a core, and each step waits
/// about as long again for its peer to get one. The square was fitted on 2 cores, 3 and 4
/// ranks, shm and tcp (docs/PERFORMANCE.md §4): it is what ranks the schedules as measured,
/// e.g. at 3 ranks halving-doubling, whose fold leaves two ranks working, ahead of the ring.
/// Returns +inf when the algorithm cannot run on the topology (hierarchical on uneven hosts)
/// or would not carry the codec (recursive doubling, raw only, with codecRatio != 1).
double predictAllReduceSeconds(Algorithm algo,
                               const Topology& topology,
                               double bytes,
                               const CostModel& model);

/// The algorithm with the lowest prediction (ties: the earlier in kAlgorithms).
Algorithm cheapestAllReduce(const Topology& topology, double bytes, const CostModel& model);

/// Predicted seconds of a reduce to one root (schedule.h): the chain pipelines chunks through
/// N-1 hops and its root receives the buffer once; the binomial tree takes ceil(log2 N)
/// rounds, each a whole (pipelined) buffer into the root; the linear one round in which the
/// root receives and reduces N-1 buffers.
double predictReduceSeconds(ReduceAlgorithm algo,
                            const Topology& topology,
                            double bytes,
                            const CostModel& model);
/// The reduce algorithm with the lowest prediction (ties: the chain, then the tree).
ReduceAlgorithm cheapestReduce(const Topology& topology, double bytes, const CostModel& model);

}  // namespace gs::stream
