#pragma once

// The record each rank publishes through the rendezvous (all-gathered): who it is, the settings
// every rank must share, and the address blobs of its devices. Bytes from the network: parse()
// validates every length before use.

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "transport/memory.h"

namespace gs::control {

struct PeerInfo {
  std::string hostname;
  int32_t pid = 0;
  std::string transport;  // the network transport (tcp, verbs, loopback): must match
  int64_t chunkBytes = 0;
  int64_t slots = 0;
  std::string codec;
  std::string algo;                 // GS_ALGO: must match (ranks run one schedule per call)
  std::string algoTune;             // GS_ALGO_TUNE: must match (tuning runs agreement calls)
  int64_t shmSmallBytes = 0;        // GS_SHM_SMALL_BYTES: must match between ranks with shm
  std::vector<uint8_t> address;     // network transport blob
  std::vector<uint8_t> shmAddress;  // shm device blob; empty: no shm device on this rank
  int64_t shmFreeBytes = 0;      // room in /dev/shm when its devices opened; 0: no shm or unknown
  std::vector<uint8_t> cpuMask;  // CPUs it may run on (callingThreadCpuMask); empty: unknown
  std::vector<std::pair<int32_t, transport::RemoteKey>> slotKeys;  // (for peer, its slots)

  std::vector<uint8_t> serialize() const;
  /// Throws kRemote naming `rank` for a record of another version, a field longer than its
  /// bound, a truncated record or trailing bytes.
  static PeerInfo parse(std::span<const uint8_t> bytes, int rank);
};

/// Every rank's record (indexed by rank, as the rendezvous or a parent's allgather returned
/// them), parsed and each checked against `mine` (this is rank `myRank`). Throws as parse()
/// and checkCompatible() do, naming the rank.
std::vector<PeerInfo> parseRecords(const std::vector<std::vector<uint8_t>>& records,
                                   const PeerInfo& mine,
                                   int myRank);

/// Settings every rank must share, or collectives would not match chunk for chunk. Throws
/// kInvalidArgument naming both ranks and the setting.
void checkCompatible(const PeerInfo& mine, const PeerInfo& theirs, int myRank, int theirRank);

}  // namespace gs::control
