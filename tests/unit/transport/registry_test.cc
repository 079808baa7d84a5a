#include <gtest/gtest.h>

#include "tests/unit/transport/test_util.h"

namespace gs::transport::testing {
namespace {

// On a host without an RDMA device (this test's premise; it skips elsewhere) asking for verbs
// is GS_ERR_UNSUPPORTED saying why, and auto picks tcp.
TEST(TransportRegistry, VerbsWithoutRdmaDeviceIsUnsupported) {
  std::unique_ptr<Device> device;
  try {
    device = createDevice("verbs", makeOptions(0, 1, freshFabricId(), {}));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUnsupported);
    const std::string why = e.what();
    EXPECT_TRUE(why.find("no RDMA device") != std::string::npos ||
                why.find("no active RDMA port") != std::string::npos ||
                why.find("not built in") != std::string::npos)
        << why;
    EXPECT_EQ(resolveTransportName("auto", Config{}), "tcp");
    return;
  }
  GTEST_SKIP() << "this host has an RDMA device (" << device->properties().name << ")";
}

TEST(TransportRegistry, UnknownNameIsNamed) {
  try {
    createDevice("carrier-pigeon", makeOptions(0, 1, freshFabricId(), {}));
    FAIL() << "unknown device created";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("carrier-pigeon"), std::string::npos) << e.what();
  }
}

TEST(TransportRegistry, AutoResolvesConsistently) {
  const std::string first = resolveTransportName("auto", Config{});
  EXPECT_TRUE(first == "tcp" || first == "verbs") << first;
  EXPECT_EQ(resolveTransportName("auto", Config{}), first);
  EXPECT_EQ(resolveTransportName("loopback", Config{}), "loopback");
}

TEST(TransportRegistry, LoopbackRejectsDuplicateRank) {
  const uint64_t fabric = freshFabricId();
  auto a = createDevice("loopback", makeOptions(0, 2, fabric, {}));
  EXPECT_THROW(createDevice("loopback", makeOptions(0, 2, fabric, {})), Error);
}

TEST(TransportRegistry, BadBlobIsInvalidArgument) {
  for (const char* backend : {"loopback", "tcp"}) {
    auto d = createDevice(backend, makeOptions(0, 2, freshFabricId(), {}));
    std::vector<uint8_t> junk(5, 1);
    try {
      d->connect(1, junk, Deadline::afterMs(100));
      ADD_FAILURE() << backend;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument) << backend << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace gs::transport::testing
