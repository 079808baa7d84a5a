#include "control/peer_info.h"

#include <sched.h>

#include "common/bytes.h"
#include "common/error.h"

namespace gs::control {

namespace {
constexpr uint32_t kPeerInfoMagic = 0x49505347;  // "GSPI"
// 2: shmAddress after address. 3: shmSmallBytes after codec. 4: shmFreeBytes after shmAddress.
// 5: cpuMask after shmFreeBytes. 6: algo and algoTune after shmSmallBytes.
constexpr uint16_t kPeerInfoVersion = 6;
constexpr size_t kMaxAddressBytes = 4096;
constexpr size_t kMaxCpuMaskBytes = CPU_SETSIZE / 8;
}  // namespace

std::vector<uint8_t> PeerInfo::serialize() const {
  ByteWriter w;
  w.put(kPeerInfoMagic);
  w.put(kPeerInfoVersion);
  w.putString(hostname);
  w.put(pid);
  w.putString(transport);
  w.put(chunkBytes);
  w.put(slots);
  w.putString(codec);
  w.put(shmSmallBytes);
  w.putString(algo);
  w.putString(algoTune);
  w.putBytes(address);
  w.putBytes(shmAddress);
  w.put(shmFreeBytes);
  w.putBytes(cpuMask);
  w.put(static_cast<uint32_t>(slotKeys.size()));
  for (const auto& [peer, key] : slotKeys) {
    w.put(peer);
    w.put(key);
  }
  return std::move(w.bytes());
}

PeerInfo PeerInfo::parse(std::span<const uint8_t> bytes, int rank) {
  ByteReader r(bytes, formatString("rendezvous record of rank %d", rank));
  GS_CHECK(r.get<uint32_t>() == kPeerInfoMagic && r.get<uint16_t>() == kPeerInfoVersion,
           Errc::kRemote, "rank %d runs an incompatible gradstream version", rank);
  PeerInfo p;
  p.hostname = r.getString(256);
  p.pid = r.get<int32_t>();
  p.transport = r.getString(64);
  p.chunkBytes = r.get<int64_t>();
  p.slots = r.get<int64_t>();
  p.codec = r.getString(256);
  p.shmSmallBytes = r.get<int64_t>();
  p.algo = r.getString(64);
  p.algoTune = r.getString(64);
  // getBytes bounds each length (bytes from the network are untrusted).
  p.address = r.getBytes(kMaxAddressBytes);
  p.shmAddress = r.getBytes(kMaxAddressBytes);
  p.shmFreeBytes = r.get<int64_t>();
  GS_CHECK(p.shmFreeBytes >= 0, Errc::kRemote, "rank %d sent a negative /dev/shm size", rank);
  p.cpuMask = r.getBytes(kMaxCpuMaskBytes);
  const auto n = r.get<uint32_t>();
  GS_CHECK(n <= 64, Errc::kRemote, "rank %d sent %u slot keys", rank, n);
  for (uint32_t i = 0; i < n; ++i) {
    auto peer = r.get<int32_t>();
    auto key = r.get<transport::RemoteKey>();
    GS_CHECK(key.length <= transport::RemoteKey::kMaxBytes, Errc::kRemote,
             "rank %d sent a malformed memory key", rank);
    p.slotKeys.emplace_back(peer, key);
  }
  GS_CHECK(r.atEnd(), Errc::kRemote, "rank %d sent trailing bytes", rank);
  return p;
}

std::vector<PeerInfo> parseRecords(const std::vector<std::vector<uint8_t>>& records,
                                   const PeerInfo& mine,
                                   int myRank) {
  std::vector<PeerInfo> infos(records.size());
  for (size_t r = 0; r < records.size(); ++r) {
    infos[r] = PeerInfo::parse(records[r], static_cast<int>(r));
    checkCompatible(mine, infos[r], myRank, static_cast<int>(r));
  }
  return infos;
}

void checkCompatible(const PeerInfo& mine, const PeerInfo& theirs, int myRank, int theirRank) {
  GS_CHECK(
      mine.transport == theirs.transport, Errc::kInvalidArgument,
      "rank %d uses transport '%s' but rank %d uses '%s' (set GS_TRANSPORT alike on all ranks)",
      myRank, mine.transport.c_str(), theirRank, theirs.transport.c_str());
  GS_CHECK(
      mine.chunkBytes == theirs.chunkBytes && mine.slots == theirs.slots, Errc::kInvalidArgument,
      "rank %d uses chunk_bytes=%lld slots=%lld but rank %d uses chunk_bytes=%lld slots=%lld "
      "(set GS_CHUNK_BYTES and GS_SLOTS_PER_PEER alike on all ranks)",
      myRank, static_cast<long long>(mine.chunkBytes), static_cast<long long>(mine.slots),
      theirRank, static_cast<long long>(theirs.chunkBytes), static_cast<long long>(theirs.slots));
  GS_CHECK(mine.codec == theirs.codec, Errc::kInvalidArgument,
           "rank %d uses codec '%s' but rank %d uses '%s'", myRank, mine.codec.c_str(), theirRank,
           theirs.codec.c_str());
  GS_CHECK(mine.algo == theirs.algo && mine.algoTune == theirs.algoTune, Errc::kInvalidArgument,
           "rank %d uses GS_ALGO=%s GS_ALGO_TUNE=%s but rank %d uses GS_ALGO=%s GS_ALGO_TUNE=%s "
           "(set them alike on all ranks)",
           myRank, mine.algo.c_str(), mine.algoTune.c_str(), theirRank, theirs.algo.c_str(),
           theirs.algoTune.c_str());
  // Two ranks with shm take the mailbox path for the same calls only with the same bound.
  GS_CHECK(mine.shmAddress.empty() || theirs.shmAddress.empty() ||
               mine.shmSmallBytes == theirs.shmSmallBytes,
           Errc::kInvalidArgument,
           "rank %d uses GS_SHM_SMALL_BYTES=%lld but rank %d uses %lld (set it alike on all ranks)",
           myRank, static_cast<long long>(mine.shmSmallBytes), theirRank,
           static_cast<long long>(theirs.shmSmallBytes));
}

}  // namespace gs::control
