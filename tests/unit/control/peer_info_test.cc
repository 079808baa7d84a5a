// The rendezvous record (control/peer_info.h): round trip with and without an shm address, and
// hostile records (bytes from the network) refused with an error naming the rank.
#include "control/peer_info.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"

namespace gs::control {
namespace {

PeerInfo sample() {
  PeerInfo p;
  p.hostname = "node-7";
  p.pid = 4242;
  p.transport = "tcp";
  p.chunkBytes = 1 << 20;
  p.slots = 8;
  p.codec = "raw";
  p.shmSmallBytes = 16384;
  p.algo = "auto";
  p.algoTune = "crowded";
  p.address = {1, 2, 3};
  p.shmAddress = std::vector<uint8_t>(96, 0xab);
  p.cpuMask = {0x0f, 0x00, 0x01};  // CPUs 0-3 and 16
  return p;
}

// Offset of the shm address's length field in a serialized sample(): the fixed fields, then
// each string or blob as a u32 length and its bytes.
size_t shmLengthOffset(const PeerInfo& p) {
  return 4 + 2 + (4 + p.hostname.size()) + 4 + (4 + p.transport.size()) + 8 + 8 +
         (4 + p.codec.size()) + 8 + (4 + p.algo.size()) + (4 + p.algoTune.size()) +
         (4 + p.address.size());
}

TEST(PeerInfo, RoundTripsWithAndWithoutShmAddress) {
  for (bool shm : {true, false}) {
    PeerInfo p = sample();
    if (!shm)
      p.shmAddress.clear();
    const PeerInfo q = PeerInfo::parse(p.serialize(), 3);
    EXPECT_EQ(q.hostname, p.hostname);
    EXPECT_EQ(q.pid, p.pid);
    EXPECT_EQ(q.transport, p.transport);
    EXPECT_EQ(q.shmSmallBytes, p.shmSmallBytes);
    EXPECT_EQ(q.algo, p.algo);
    EXPECT_EQ(q.algoTune, p.algoTune);
    EXPECT_EQ(q.address, p.address);
    EXPECT_EQ(q.shmAddress, p.shmAddress);
    EXPECT_EQ(q.cpuMask, p.cpuMask);
    EXPECT_TRUE(q.slotKeys.empty());
  }
}

void expectRefused(const std::vector<uint8_t>& bytes, const char* what) {
  try {
    PeerInfo::parse(bytes, 5);
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kRemote) << what;
    EXPECT_NE(std::string(e.what()).find("rank 5"), std::string::npos) << what << ": " << e.what();
  }
}

TEST(PeerInfo, HostileRecordsAreRefused) {
  const PeerInfo p = sample();
  std::vector<uint8_t> bytes = p.serialize();
  const size_t at = shmLengthOffset(p);
  uint32_t length = 0;
  std::memcpy(&length, bytes.data() + at, 4);
  ASSERT_EQ(length, p.shmAddress.size()) << "layout of the test's sample changed";

  std::vector<uint8_t> huge = bytes;
  const uint32_t big = 1u << 20;  // beyond the bound, and beyond the record
  std::memcpy(huge.data() + at, &big, 4);
  expectRefused(huge, "shm address longer than its bound");

  std::vector<uint8_t> overrun = bytes;
  const uint32_t past = static_cast<uint32_t>(p.shmAddress.size() + 64);  // within the bound
  std::memcpy(overrun.data() + at, &past, 4);
  expectRefused(overrun, "shm address running past the record");

  expectRefused(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(at) + 2),
                "record cut inside the shm address length");
  std::vector<uint8_t> trailing = bytes;
  trailing.push_back(0);
  expectRefused(trailing, "trailing byte");
  std::vector<uint8_t> oldVersion = bytes;
  oldVersion[4] = 2;  // version 2 had no GS_SHM_SMALL_BYTES
  expectRefused(oldVersion, "version 2 record");

  // The CPU mask follows the shm address and the /dev/shm size; a mask longer than a cpu_set_t
  // cannot be one.
  const size_t maskAt = at + 4 + p.shmAddress.size() + 8;
  std::memcpy(&length, bytes.data() + maskAt, 4);
  ASSERT_EQ(length, p.cpuMask.size()) << "layout of the test's sample changed";
  std::vector<uint8_t> wideMask = bytes;
  const uint32_t wide = 129;  // CPU_SETSIZE / 8 + 1
  std::memcpy(wideMask.data() + maskAt, &wide, 4);
  expectRefused(wideMask, "CPU mask longer than a cpu_set_t");
}

// The mailbox bound must match where both ranks have shm (they would take different paths for
// the same call), and need not where either has none (its links never use the mailboxes).
TEST(PeerInfo, ShmSmallBytesMustMatchBetweenRanksWithShm) {
  PeerInfo a = sample(), b = sample();
  b.shmSmallBytes = 0;
  try {
    checkCompatible(a, b, 0, 1);
    ADD_FAILURE() << "different GS_SHM_SMALL_BYTES accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("rank 0 uses GS_SHM_SMALL_BYTES=16384 but rank 1 uses 0"),
              std::string::npos)
        << e.what();
  }
  b.shmAddress.clear();
  EXPECT_NO_THROW(checkCompatible(a, b, 0, 1));
}

// Ranks run one schedule per call, and GS_ALGO_TUNE's trials and agreements at the same calls:
// both settings must match, named in the error.
TEST(PeerInfo, AlgorithmSettingsMustMatch) {
  for (int which = 0; which < 2; ++which) {
    PeerInfo a = sample(), b = sample();
    (which == 0 ? b.algo : b.algoTune) = which == 0 ? "ring" : "off";
    try {
      checkCompatible(a, b, 2, 3);
      ADD_FAILURE() << "different algorithm settings accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      const std::string want = which == 0 ? "rank 3 uses GS_ALGO=ring GS_ALGO_TUNE=crowded"
                                          : "rank 3 uses GS_ALGO=auto GS_ALGO_TUNE=off";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace gs::control
