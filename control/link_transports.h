#pragma once

// Which transport carries each link of a communicator: the network device (tcp or verbs) or,
// between ranks of one host, the shm device next to it. Pure functions of the rendezvous
// records, so both ranks of a pair decide alike.

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "transport/device.h"

namespace gs::control {

/// What a rank's rendezvous record says about the choice.
struct TransportEndpoint {
  std::string hostname;             // the topology's host name (GS_HOSTNAME or gethostname())
  std::vector<uint8_t> shmAddress;  // its shm device's blob; empty: it has no shm device
};

/// Whether an shm device was opened and used (the gs_transport_info{shm} label).
enum class ShmState {
  kOff,          // GS_SHM=0, a single rank, or a transport it does not go with (loopback)
  kUnavailable,  // asked for, but the device could not be opened (the warning says why)
  kUnused,       // open, but no peer of a schedule qualifies
  kInUse,        // serves at least one link
};
const char* shmStateName(ShmState state);

/// Opens the shm device that serves a rank's same-host peers next to its network device, when
/// config.shm asks for it, there is more than one rank, and the network transport is tcp or
/// verbs (loopback ranks are threads of one process: loopback already is their memory path).
/// Returns null when not wanted (state kOff) or when the device cannot be opened (kUnavailable:
/// a warning with the reason, the first time in the process; later ones at info). The network
/// device then carries every link.
std::unique_ptr<transport::Device> openShmDevice(const std::string& networkTransport,
                                                 const transport::DeviceOptions& options,
                                                 ShmState& state);

/// Whether ranks a and b exchange chunks over shm: both published an shm address, they name the
/// same host, and their addresses are of one shared-memory domain
/// (transport::sameHostReachable, which asks both ways). Symmetric by construction: both ranks
/// of a pair get the same answer from the same two records.
bool shmBetween(const TransportEndpoint& a, const TransportEndpoint& b);

/// Whether ranks that share a host talk over shm, for the cost model's intra-host link class:
/// true when some host has several ranks and each of them qualifies with that host's first rank
/// (shmBetween). Computed from every rank's record, so every rank gets the same answer (the
/// algorithm choice must not differ between ranks).
bool shmWithinHosts(const std::vector<TransportEndpoint>& ranks);

/// Free bytes of /dev/shm now (statvfs), for a rank's record; 0 when it cannot tell.
int64_t sharedMemoryFreeBytes();

/// A host whose shm links would not fit in its /dev/shm.
struct ShmShortfall {
  std::string hostname;
  int64_t needBytes = 0;  // receive slots of the links its ranks' schedules make over shm
  int64_t freeBytes = 0;  // the least room any of its ranks saw
};

/// Every shm link needs `bytesPerLink` of /dev/shm on its host for each end's receive slots
/// (each rank's slots for each same-host peer it links to; peersOf(r): the peers rank r's
/// schedules link, asked only on hosts where not every pair would fit). A host whose links
/// would not fit in the least room its ranks published (`freeBytes`, 0: unknown, not counted;
/// needBytes then left 0) has its ranks' shm addresses cleared in `ranks`, so
/// its links go over the network as they would without shm, instead of failing at the first
/// slot that finds /dev/shm full (a container's default of 64 MiB holds fewer than 8 links of
/// the default 8 MiB). Returns those hosts. From every rank's record and schedules, so every
/// rank decides alike for every host (the cost model and the chunk size depend on it too).
std::vector<ShmShortfall> dropShmWhereSlotsDoNotFit(
    std::vector<TransportEndpoint>& ranks,
    const std::vector<int64_t>& freeBytes,
    const std::function<std::set<int>(int)>& peersOf,
    int64_t bytesPerLink);

/// The pipeline chunk of a communicator's calls: `configured` (GS_CHUNK_BYTES, the receive slot
/// size), except at its default of 1 MiB on a tcp communicator where some pair of ranks talks
/// over tcp (ranks on several hosts, or one host without shm between all of them): 256 KiB.
/// Measured over loopback tcp, 2 ranks: a 16 MiB allreduce 5.1-5.5 ms in 256 KiB chunks against
/// 7.9 in 1 MiB ones (64 MiB 25-26 against 34-36; 128 and 512 KiB in between); over shm, 1 MiB
/// stays faster. From every rank's record, so every rank gets the same chunk (both ends of a
/// link must cut a block alike).
int64_t pipelineChunkBytes(const std::string& networkTransport,
                           const std::vector<TransportEndpoint>& ranks,
                           int64_t configured);
inline constexpr int64_t kTcpChunkBytes = 256 << 10;

/// The transports serving a rank's links, for Communicator::transportName(): "shm" (every link
/// over shm), "shm+tcp" / "shm+verbs" (both), or the network transport's name (no link over
/// shm, or no link at all).
std::string linkTransportsName(const std::string& networkTransport, int shmLinks, int networkLinks);

}  // namespace gs::control
