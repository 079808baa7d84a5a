// Failure notices are bytes a peer wrote into this rank's memory: what decodes must be exactly
// what was encoded, and anything else must be refused, never read past its length.
#include "stream/failure_notice.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace gs::stream {
namespace {

std::vector<uint8_t> encoded(const FailureNotice& n) {
  std::vector<uint8_t> buf(4096);
  buf.resize(encodeNotice(n, buf.data(), buf.size()));
  return buf;
}

TEST(FailureNotice, RoundTrips) {
  const FailureNotice n{Errc::kInvalidArgument, 2, 3, "count differs between ranks", 70000};
  const auto buf = encoded(n);
  const auto d = decodeNotice(buf.data(), buf.size(), 4);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->code, n.code);
  EXPECT_EQ(d->origin, 2);
  EXPECT_EQ(d->detector, 3);
  EXPECT_EQ(d->cause, n.cause);
  EXPECT_EQ(d->senderCompleted, 70000u);
}

TEST(FailureNotice, LongCausesAreCutNotOverrun) {
  const FailureNotice n{Errc::kTimeout, 0, 1, std::string(5000, 'x')};
  std::vector<uint8_t> small(100);
  const size_t used = encodeNotice(n, small.data(), small.size());
  EXPECT_LE(used, small.size());
  const auto d = decodeNotice(small.data(), used, 2);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->cause, std::string(d->cause.size(), 'x'));
  EXPECT_EQ(d->cause.size(), used - 24);  // all the room after the 24-byte header
  const auto big = encoded(n);
  EXPECT_EQ(decodeNotice(big.data(), big.size(), 2)->cause.size(), kMaxNoticeCause);
}

TEST(FailureNotice, MalformedBytesAreRefused) {
  const auto good = encoded(FailureNotice{Errc::kRemote, 1, 0, "cause"});
  EXPECT_FALSE(decodeNotice(good.data(), 10, 4)) << "shorter than the header";
  EXPECT_FALSE(decodeNotice(good.data(), good.size() - 1, 4)) << "cause longer than the bytes";
  EXPECT_FALSE(decodeNotice(good.data(), good.size(), 1)) << "origin outside the communicator";
  auto bad = good;
  bad[0] ^= 1;
  EXPECT_FALSE(decodeNotice(bad.data(), bad.size(), 4)) << "magic";
  bad = good;
  const int16_t ok = 0;  // kOk is not a failure
  std::memcpy(bad.data() + 6, &ok, 2);
  EXPECT_FALSE(decodeNotice(bad.data(), bad.size(), 4)) << "code";
  bad = good;
  const int32_t negative = -1;
  std::memcpy(bad.data() + 12, &negative, 4);
  EXPECT_FALSE(decodeNotice(bad.data(), bad.size(), 4)) << "detector";
}

TEST(FailureNotice, UnprintableBytesInTheCauseAreReplaced) {
  const auto buf =
      encoded(FailureNotice{Errc::kRemote, 1, 0, std::string("a\nb\x1b[31mc\xff", 10)});
  const auto d = decodeNotice(buf.data(), buf.size(), 2);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->cause, "a?b?[31mc?");
}

}  // namespace
}  // namespace gs::stream
