// The per-peer transport choice (control/link_transports.h): when shared memory serves a link,
// that both ranks of a pair decide alike, what the communicator reports, and that a shm device
// that cannot open leaves the network transport in charge.
#include "control/link_transports.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/config.h"
#include "transport/device.h"

namespace gs::control {
namespace {

transport::DeviceOptions optionsFor(int rank, int nranks, bool shm) {
  transport::DeviceOptions o;
  o.rank = rank;
  o.nranks = nranks;
  for (size_t i = 0; i < o.secret.size(); ++i)
    o.secret[i] = static_cast<uint8_t>(7 * i + 3);
  o.config.shm = shm;
  return o;
}

TEST(LinkTransports, NameSaysWhatCarriesTheLinks) {
  EXPECT_EQ(linkTransportsName("tcp", 0, 3), "tcp");
  EXPECT_EQ(linkTransportsName("tcp", 0, 0), "tcp");  // a single rank: no link at all
  EXPECT_EQ(linkTransportsName("tcp", 2, 0), "shm");
  EXPECT_EQ(linkTransportsName("tcp", 2, 1), "shm+tcp");
  EXPECT_EQ(linkTransportsName("verbs", 1, 4), "shm+verbs");
  EXPECT_EQ(linkTransportsName("loopback", 0, 3), "loopback");
}

TEST(LinkTransports, NoShmWithoutBothAddressesAndOneHostName) {
  const std::vector<uint8_t> blob = {1, 2, 3, 4};
  const TransportEndpoint noShm{"h0", {}};
  const TransportEndpoint a{"h0", blob};
  const TransportEndpoint otherHost{"h1", blob};
  EXPECT_FALSE(shmBetween(noShm, a));
  EXPECT_FALSE(shmBetween(a, noShm));
  EXPECT_FALSE(shmBetween(a, otherHost));
  EXPECT_FALSE(shmBetween(otherHost, a));
  // Garbage blobs are in no shared-memory domain, whatever the host names say.
  EXPECT_FALSE(shmBetween(a, a));
}

TEST(LinkTransports, IntraHostClassNeedsAHostWithSeveralRanks) {
  const std::vector<uint8_t> blob = {9, 9};
  EXPECT_FALSE(shmWithinHosts({{"h0", blob}, {"h1", blob}}));  // one rank per host
  EXPECT_FALSE(shmWithinHosts({{"h0", blob}, {"h0", {}}}));    // one of them without shm
  EXPECT_FALSE(shmWithinHosts({}));
}

TEST(LinkTransports, NotOpenedWhenOffOrNotNextToANetworkTransport) {
  ShmState state = ShmState::kInUse;
  EXPECT_EQ(openShmDevice("tcp", optionsFor(0, 2, false), state), nullptr);
  EXPECT_EQ(state, ShmState::kOff);
  state = ShmState::kInUse;
  EXPECT_EQ(openShmDevice("loopback", optionsFor(0, 2, true), state), nullptr);
  EXPECT_EQ(state, ShmState::kOff);
  state = ShmState::kInUse;
  EXPECT_EQ(openShmDevice("tcp", optionsFor(0, 1, true), state), nullptr);
  EXPECT_EQ(state, ShmState::kOff);
  EXPECT_STREQ(shmStateName(ShmState::kUnavailable), "unavailable");
  EXPECT_STREQ(shmStateName(ShmState::kInUse), "in_use");
}

// Whether or not the shm backend can open here, the answer is consistent: a device and kUnused,
// or null and kUnavailable (never an exception: the network transport takes over).
TEST(LinkTransports, OpenedNextToTcpOrReportedUnavailable) {
  ShmState state = ShmState::kOff;
  std::unique_ptr<transport::Device> device;
  ASSERT_NO_THROW(device = openShmDevice("tcp", optionsFor(0, 2, true), state));
  EXPECT_EQ(state, device ? ShmState::kUnused : ShmState::kUnavailable);
}

// Two shm devices of this process (threads as ranks): one shared-memory domain. Needs the shm
// backend.
class TwoShmDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    ShmState s0 = ShmState::kOff, s1 = ShmState::kOff;
    d0_ = openShmDevice("tcp", optionsFor(0, 2, true), s0);
    d1_ = openShmDevice("tcp", optionsFor(1, 2, true), s1);
    ASSERT_NE(d0_, nullptr) << "the shm transport did not open";
    ASSERT_NE(d1_, nullptr) << "the shm transport did not open";
    a = {"h0", d0_->address()};
    b = {"h0", d1_->address()};
    bElsewhere = {"h1", d1_->address()};
  }
  std::unique_ptr<transport::Device> d0_, d1_;
  TransportEndpoint a, b, bElsewhere;
};

// Same host name means shm, another host name does not, both ways alike.
TEST_F(TwoShmDevices, RanksOfOneProcessAndHostNameUseShm) {
  EXPECT_TRUE(shmBetween(a, b));
  EXPECT_TRUE(shmBetween(b, a));
  EXPECT_FALSE(shmBetween(a, bElsewhere));
  EXPECT_FALSE(shmBetween(bElsewhere, a));
  EXPECT_TRUE(shmWithinHosts({a, b}));
  EXPECT_FALSE(shmWithinHosts({a, bElsewhere}));
}

// Over tcp the default chunk is cut to 256 KiB wherever some pair talks over tcp; a chunk the
// user chose, other transports, and one host with shm between all ranks keep it as configured.
TEST_F(TwoShmDevices, TcpCommunicatorsPipelineInSmallerChunksAtTheDefault) {
  const TransportEndpoint bNoShm{"h0", {}};
  const int64_t def = Config{}.chunkBytes;                 // GS_CHUNK_BYTES left at its default
  EXPECT_EQ(pipelineChunkBytes("tcp", {a, b}, def), def);  // all over shm
  EXPECT_EQ(pipelineChunkBytes("tcp", {a, bElsewhere}, def), kTcpChunkBytes);  // two hosts
  EXPECT_EQ(pipelineChunkBytes("tcp", {a, bNoShm}, def), kTcpChunkBytes);      // GS_SHM=0 on one
  EXPECT_EQ(pipelineChunkBytes("tcp", {a, b, bElsewhere}, def), kTcpChunkBytes);
  EXPECT_EQ(pipelineChunkBytes("tcp", {a, bElsewhere}, 4 << 20), 4 << 20);  // chosen by the user
  EXPECT_EQ(pipelineChunkBytes("verbs", {a, bElsewhere}, def), def);
  EXPECT_EQ(pipelineChunkBytes("loopback", {a, bNoShm}, def), def);
  EXPECT_EQ(pipelineChunkBytes("tcp", {bNoShm}, def), def);  // one rank: no link
}

// Each host's shm links against the least room its ranks saw: a host short of /dev/shm loses
// its shm addresses (its links go over the network), one with room keeps them, every rank
// computing the same from the same records; an unknown room (0) drops nothing.
TEST_F(TwoShmDevices, AHostWhoseSlotsDoNotFitInItsSharedMemoryUsesTheNetwork) {
  const int64_t link = 10 << 20;
  int asked = 0;  // the schedules' peers are built only where not every pair would fit
  const auto eachOther = [&](int r) {
    ++asked;
    return std::set<int>{1 - r};
  };
  // Two links of 10 MiB (one per end) on host h0.
  std::vector<TransportEndpoint> fits{a, b};
  EXPECT_TRUE(dropShmWhereSlotsDoNotFit(fits, {20 << 20, 30 << 20}, eachOther, link).empty());
  EXPECT_TRUE(shmBetween(fits[0], fits[1]));
  EXPECT_EQ(asked, 0);
  std::vector<TransportEndpoint> tight{a, b};
  const auto dropped = dropShmWhereSlotsDoNotFit(tight, {30 << 20, 19 << 20}, eachOther, link);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].hostname, "h0");
  EXPECT_EQ(dropped[0].needBytes, 2 * link);
  EXPECT_EQ(dropped[0].freeBytes, 19 << 20);  // the least room any of its ranks saw
  EXPECT_EQ(asked, 2);
  EXPECT_FALSE(shmBetween(tight[0], tight[1]));
  EXPECT_TRUE(tight[0].shmAddress.empty() && tight[1].shmAddress.empty());
  std::vector<TransportEndpoint> unknown{a, b};
  EXPECT_TRUE(dropShmWhereSlotsDoNotFit(unknown, {0, 0}, eachOther, link).empty());
  // Peers on another host need no shm: nothing to fit, nothing dropped.
  std::vector<TransportEndpoint> apart{a, bElsewhere};
  EXPECT_TRUE(dropShmWhereSlotsDoNotFit(apart, {1, 1}, eachOther, link).empty());
  EXPECT_FALSE(apart[0].shmAddress.empty());
}

}  // namespace
}  // namespace gs::control
