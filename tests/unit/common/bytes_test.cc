// ByteWriter/ByteReader: round trips, and hostile input (truncated, oversized) -> kRemote.
#include "common/bytes.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"

namespace gs {
namespace {

template <class F>
void expectRemote(F f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kRemote) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Bytes, RoundTripLittleEndian) {
  ByteWriter w;
  w.put<uint32_t>(0x11223344u);
  w.put<uint8_t>(0xab);
  w.put<int64_t>(-2);
  w.putString("hello");
  w.putBytes(std::vector<uint8_t>{});
  w.put<uint16_t>(0xbeef);
  const std::vector<uint8_t> bytes = w.bytes();
  // Layout: 4 + 1 + 8 + (4 + 5) + 4 + 2.
  ASSERT_EQ(bytes.size(), 28u);
  EXPECT_EQ(bytes[0], 0x44);
  EXPECT_EQ(bytes[3], 0x11);
  EXPECT_EQ(bytes[13], 5);  // string length, little-endian u32
  EXPECT_EQ(bytes[14], 0);
  EXPECT_EQ(bytes[17], 'h');

  ByteReader r(bytes, "test message");
  EXPECT_EQ(r.get<uint32_t>(), 0x11223344u);
  EXPECT_EQ(r.get<uint8_t>(), 0xab);
  EXPECT_EQ(r.get<int64_t>(), -2);
  EXPECT_FALSE(r.atEnd());
  EXPECT_EQ(r.getString(5), "hello");
  EXPECT_TRUE(r.getBytes(0).empty());
  EXPECT_EQ(r.get<uint16_t>(), 0xbeef);
  EXPECT_TRUE(r.atEnd());
}

TEST(Bytes, EveryTruncationIsRejected) {
  ByteWriter w;
  w.put<uint32_t>(7);
  w.putString("abcdefgh");
  w.put<uint64_t>(9);
  const std::vector<uint8_t> full = w.bytes();
  for (size_t len = 0; len < full.size(); ++len) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<long>(len));
    expectRemote(
        [&] {
          ByteReader r(cut, "hello from rank 3");
          r.get<uint32_t>();
          r.getString(64);
          r.get<uint64_t>();
        },
        "hello from rank 3");
  }
  ByteReader r(full, "whole");
  EXPECT_NO_THROW({
    r.get<uint32_t>();
    r.getString(64);
    r.get<uint64_t>();
  });
  EXPECT_TRUE(r.atEnd());
  expectRemote([&] { r.get<uint8_t>(); }, "whole");
}

TEST(Bytes, OversizedFieldsAreRejectedBeforeReading) {
  ByteWriter w;
  w.putString(std::string(100, 'z'));
  const auto bytes = w.bytes();
  {
    ByteReader r(bytes, "address blob");
    expectRemote([&] { r.getString(99); }, "address blob");
  }
  {
    ByteReader r(bytes, "address blob");
    EXPECT_EQ(r.getString(100), std::string(100, 'z'));
  }
  // A length prefix claiming 4 GiB - 1 bytes with none following: rejected, no allocation.
  ByteWriter huge;
  huge.put<uint32_t>(0xffffffffu);
  const auto hb = huge.bytes();
  {
    ByteReader r(hb, "huge");
    expectRemote([&] { r.getBytes(SIZE_MAX); }, "huge");
  }
  {
    ByteReader r(hb, "huge");
    expectRemote([&] { r.getBytes(1024); }, "huge");
  }
  // Length prefix larger than what is left (but below the cap).
  ByteWriter shortBody;
  shortBody.put<uint32_t>(10);
  shortBody.put<uint32_t>(0);
  const auto sb = shortBody.bytes();
  ByteReader r(sb, "short body");
  expectRemote([&] { r.getBytes(1000); }, "short body");
}

TEST(Bytes, EmptyInput) {
  std::vector<uint8_t> none;
  ByteReader r(none, "empty");
  EXPECT_TRUE(r.atEnd());
  expectRemote([&] { r.get<uint8_t>(); }, "empty");
  ByteReader r2(none, "empty");
  expectRemote([&] { r2.getString(10); }, "empty");
}

}  // namespace
}  // namespace gs
