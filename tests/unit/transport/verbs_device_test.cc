// Verbs-specific behaviour on a real device (Soft-RoCE in the test VM): port and GID
// selection, the registration cache, remote keys, and set-up mismatches. Skips without a device.
#include <cstdlib>
#include <cstring>

#include "tests/unit/transport/test_util.h"
#include "transport/verbs/device.h"
#include "transport/verbs/registration.h"

namespace gs::transport::testing {
namespace {

class VerbsDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = verbs::rdmaUnavailableReason(Config{});
    if (!why.empty())
      GTEST_SKIP() << "no usable RDMA device: " << why;
  }
};

TEST_F(VerbsDevice, PicksAnActivePortAndAnIpv4MappedRoceV2Gid) {
  auto device = std::make_unique<verbs::Device>(makeOptions(0, 1, freshFabricId(), {}));
  const auto& port = device->port();
  EXPECT_EQ(port.attr.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(device->properties().name, "verbs:" + port.name());
  if (port.ethernet) {
    // Soft-RoCE and routed RoCE fabrics: the IPv4-mapped RoCEv2 GID, never a link-local one.
    EXPECT_EQ(verbs::gidText(port.gid).rfind("::ffff:", 0), 0u) << port.gidDescription;
    EXPECT_NE(port.gidDescription.find("RoCEv2"), std::string::npos) << port.gidDescription;
  }
}

TEST_F(VerbsDevice, HcaFilterSelectsTheNamedDevice) {
  DeviceOptions o = makeOptions(0, 1, freshFabricId(), {});
  auto first = std::make_unique<verbs::Device>(o);
  o.config.ibHca = first->port().deviceName + ":" + std::to_string(first->port().port);
  auto again = std::make_unique<verbs::Device>(o);
  EXPECT_EQ(again->port().name(), first->port().name());
  o.config.ibHca = "no_such_hca";
  try {
    verbs::Device d(o);
    FAIL() << "device created for a filter that names nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("not in GS_IB_HCA"), std::string::npos) << e.what();
  }
}

TEST_F(VerbsDevice, GidIndexOutOfRangeIsInvalidArgument) {
  DeviceOptions o = makeOptions(0, 1, freshFabricId(), {});
  o.config.ibGidIndex = 1023;
  try {
    verbs::Device d(o);
    FAIL() << "GID index 1023 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("GS_IB_GID_INDEX"), std::string::npos) << e.what();
  }
}

TEST_F(VerbsDevice, RegistrationsCoveringARangeAreSharedAndReleased) {
  auto device = std::make_unique<verbs::Device>(makeOptions(0, 1, freshFabricId(), {}));
  std::vector<uint8_t> buffer(1 << 20);
  auto whole = device->registerMemory(buffer.data(), buffer.size());
  EXPECT_EQ(device->registrations(), 1u);
  auto part = device->registerMemory(buffer.data() + 4096, 8192);  // inside: shared
  EXPECT_EQ(device->registrations(), 1u);
  std::vector<uint8_t> other(4096);
  auto separate = device->registerMemory(other.data(), other.size());
  EXPECT_EQ(device->registrations(), 2u);
  verbs::RemoteTarget t;
  ASSERT_TRUE(verbs::parseRemoteKey(part->remoteKey(), &t));
  EXPECT_EQ(t.address, reinterpret_cast<uintptr_t>(buffer.data() + 4096));
  EXPECT_EQ(t.length, 8192u);
  whole.reset();
  EXPECT_EQ(device->registrations(), 2u);  // part still holds it
  part.reset();
  separate.reset();
  EXPECT_EQ(device->registrations(), 0u);
}

TEST_F(VerbsDevice, MismatchedQpCountsAreNamed) {
  const uint64_t fabric = freshFabricId();
  DeviceOptions a = makeOptions(0, 2, fabric, {});
  DeviceOptions b = makeOptions(1, 2, fabric, {});
  a.config.ibQpsPerPeer = 2;
  b.config.ibQpsPerPeer = 3;
  auto d0 = std::make_unique<verbs::Device>(a);
  auto d1 = std::make_unique<verbs::Device>(b);
  std::string errors[2];
  std::thread t([&] {
    try {
      d1->connect(0, d0->address(), Deadline::afterMs(20000));
    } catch (const Error& e) {
      errors[1] = e.what();
    }
  });
  try {
    d0->connect(1, d1->address(), Deadline::afterMs(20000));
  } catch (const Error& e) {
    errors[0] = e.what();
  }
  t.join();
  for (const std::string& e : errors)
    EXPECT_NE(e.find("GS_IB_QPS_PER_PEER"), std::string::npos) << e;
}

TEST_F(VerbsDevice, ConnectionsReportThePortsHardwareCounters) {
  auto ranks = connectRanks("verbs", 2);
  ASSERT_TRUE(ranks[0].peers[1]);
  LinkInfo info;
  // rxe and mlx5 both expose retransmission counters; the values are the port's totals.
  EXPECT_TRUE(ranks[0].peers[1]->linkInfo(&info));
}

TEST_F(VerbsDevice, TcpBlobIsRejectedAsAnotherTransport) {
  auto device = std::make_unique<verbs::Device>(makeOptions(0, 2, freshFabricId(), {}));
  std::vector<uint8_t> tcpBlob(32, 0);
  try {
    device->connect(1, tcpBlob, Deadline::afterMs(1000));
    FAIL() << "tcp blob accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("another transport"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gs::transport::testing
