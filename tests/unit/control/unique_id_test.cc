#include "control/unique_id.h"

#include <random>

#include <gtest/gtest.h>

#include "common/error.h"

namespace gs::control {
namespace {

UniqueId sampleId(const char* address) {
  UniqueId id;
  id.address = IpAddress::parse(address);
  id.port = 29501;
  id.secret = randomSecret();
  return id;
}

void expectInvalid(std::span<const uint8_t> bytes, const char* why) {
  try {
    UniqueId::parse(bytes);
    ADD_FAILURE() << "accepted a unique id with " << why;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument) << why;
    EXPECT_EQ(std::string(e.what()).rfind("unique id is invalid: ", 0), 0u) << e.what();
  }
}

TEST(UniqueId, RoundTripsIpv4AndIpv6) {
  for (const char* address : {"127.0.0.1", "10.20.30.40", "::1", "2001:db8::17"}) {
    UniqueId id = sampleId(address);
    auto bytes = id.serialize();
    static_assert(sizeof(bytes) == 128);
    UniqueId back = UniqueId::parse(bytes);
    EXPECT_EQ(back.address, id.address) << address;
    EXPECT_EQ(back.port, id.port);
    EXPECT_EQ(back.secret, id.secret);
  }
  EXPECT_EQ(sampleId("::1").endpoint(), "[::1]:29501");
}

TEST(UniqueId, RejectsGarbage) {
  auto good = sampleId("10.0.0.1").serialize();

  std::array<uint8_t, 128> zeros{};
  expectInvalid(zeros, "all zeros");
  expectInvalid(std::span(good).first(127), "a truncated id");
  std::vector<uint8_t> longer(good.begin(), good.end());
  longer.push_back(0);
  expectInvalid(longer, "an extra byte");

  auto badMagic = good;
  badMagic[0] ^= 1;
  expectInvalid(badMagic, "a bad magic");
  auto badVersion = good;
  badVersion[4] = 99;
  expectInvalid(badVersion, "an unknown version");
  // Every single-bit flip in the covered bytes or the reserved area must be caught.
  for (size_t i = 5; i < good.size(); ++i) {
    auto flipped = good;
    flipped[i] ^= 0x10;
    expectInvalid(flipped, "a flipped bit");
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::array<uint8_t, 128> random{};
    for (auto& b : random)
      b = static_cast<uint8_t>(rng());
    if (trial % 2)
      std::copy_n(good.begin(), 6, random.begin());  // plausible header
    expectInvalid(random, "random bytes");
  }
  UniqueId portZero = sampleId("10.0.0.1");
  portZero.port = 0;
  expectInvalid(portZero.serialize(), "port 0");
  UniqueId unspecified = sampleId("0.0.0.0");
  expectInvalid(unspecified.serialize(), "an unspecified address");
}

}  // namespace
}  // namespace gs::control
