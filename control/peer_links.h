#pragma once

#include <memory>
#include <set>
#include <vector>

#include "common/clock.h"
#include "schedules/schedule.h"
#include "schedules/topology.h"
#include "stream/link.h"
#include "transport/device.h"

namespace gs::control {

/// The allreduce algorithms a GS_ALGO setting may run: all of them for "auto" (hierarchical
/// only on a topology with the same number of ranks per host), else the one named. Throws
/// kInvalidArgument for an unknown name.
std::vector<stream::Algorithm> allowedAlgorithms(const std::string& setting,
                                                 const stream::Topology& topology);

/// Every peer this rank exchanges chunks with in any schedule it may run: the ring / chain
/// neighbours (all collectives) and the peers of each allowed allreduce algorithm. Symmetric:
/// p is in rank's set exactly when rank is in p's.
std::set<int> schedulePeers(int rank,
                            const stream::Topology& topology,
                            const std::vector<stream::Algorithm>& algorithms);

/// One peer to connect: the device that serves it and the peer's address blob for that device.
struct PeerEndpoint {
  int peer = -1;
  transport::Device* device = nullptr;
  std::vector<uint8_t> address;
};

/// Connects to every endpoint (ascending peer order on every rank, so pairs never wait on each
/// other in a cycle), creates each peer's Link with its receive slots on that peer's device,
/// and swaps slot keys with the peer over the new connection (two-sided send/recv), then
/// attaches. Throws kTimeout at the deadline or kRemote naming a peer that sends a malformed
/// key or fails.
std::vector<std::unique_ptr<stream::Link>> connectPeerLinks(int nranks,
                                                            const std::vector<PeerEndpoint>& peers,
                                                            const stream::SlotLayout& layout,
                                                            Deadline deadline);

}  // namespace gs::control
