#include <gtest/gtest.h>

#include "tests/unit/transport/test_util.h"

namespace gs::transport::testing {
namespace {

TEST(TransportRegistry, VerbsIsNotBuiltIn) {
  try {
    createDevice("verbs", makeOptions(0, 1, freshFabricId(), {}));
    FAIL() << "verbs device created";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUnsupported);
    EXPECT_STREQ(e.what(), "verbs transport is not built in this version");
  }
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

TEST(TransportRegistry, AutoResolvesToTcp) {
  EXPECT_EQ(resolveTransportName("auto"), "tcp");
  EXPECT_EQ(resolveTransportName("auto"), "tcp");
  EXPECT_EQ(resolveTransportName("loopback"), "loopback");
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
