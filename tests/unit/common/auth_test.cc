// SipHash-2-4 against the reference test vectors, and the MAC helpers built on it.
#include "common/auth.h"

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace gs {
namespace {

// SipHash-2-4 reference vectors (Aumasson & Bernstein; the reference implementation's
// vectors.h): key = 00 01 .. 0f, message i = 00 01 .. (i-1), output as a little-endian u64.
// Length 15 is the paper's Appendix A example: 0xa129ca6149be45e5.
struct Vector {
  size_t length;
  uint64_t value;
};
constexpr Vector kVectors[] = {
    {0, 0x726fdb47dd0e0e31ULL},  {1, 0x74f839c593dc67fdULL},  {2, 0x0d6c8009d9a94f5aULL},
    {3, 0x85676696d7fb7e2dULL},  {4, 0xcf2794e0277187b7ULL},  {5, 0x18765564cd99a68dULL},
    {6, 0xcbc9466e58fee3ceULL},  {7, 0xab0200f58b01d137ULL},  {8, 0x93f5f5799a932462ULL},
    {9, 0x9e0082df0ba9e4b0ULL},  {15, 0xa129ca6149be45e5ULL}, {16, 0x3f2acc7f57c29bdbULL},
    {63, 0x958a324ceb064572ULL},
};

std::array<uint8_t, 16> referenceKey() {
  std::array<uint8_t, 16> k{};
  for (int i = 0; i < 16; ++i)
    k[i] = static_cast<uint8_t>(i);
  return k;
}

TEST(SipHash, ReferenceVectors) {
  const auto key = referenceKey();
  uint8_t msg[64];
  for (int i = 0; i < 64; ++i)
    msg[i] = static_cast<uint8_t>(i);
  for (const Vector& v : kVectors) {
    EXPECT_EQ(sipHash24(key.data(), msg, v.length), v.value) << "length " << v.length;
  }
}

TEST(SipHash, PaperAppendixExample) {
  const auto key = referenceKey();
  const uint8_t msg[15] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  EXPECT_EQ(sipHash24(key.data(), msg, sizeof(msg)), 0xa129ca6149be45e5ULL);
}

TEST(SipHash, DoesNotReadPastTheMessage) {
  // The tail block must use only `len` bytes: the bytes after the message must not matter.
  const auto key = referenceKey();
  for (size_t len = 0; len < 24; ++len) {
    std::vector<uint8_t> a(32, 0x00), b(32, 0xff);
    for (size_t i = 0; i < len; ++i)
      a[i] = b[i] = static_cast<uint8_t>(i * 13 + 1);
    EXPECT_EQ(sipHash24(key.data(), a.data(), len), sipHash24(key.data(), b.data(), len)) << len;
  }
}

TEST(SipHash, KeyAndMessageSensitivity) {
  auto key = referenceKey();
  const char msg[] = "gradstream";
  const uint64_t base = sipHash24(key.data(), msg, sizeof(msg) - 1);
  for (int byte = 0; byte < 16; ++byte) {
    auto k = key;
    k[byte] ^= 1;
    EXPECT_NE(sipHash24(k.data(), msg, sizeof(msg) - 1), base) << "key byte " << byte;
  }
  // A message and the same message with a trailing zero byte differ (length is hashed).
  EXPECT_NE(sipHash24(key.data(), msg, sizeof(msg) - 1), sipHash24(key.data(), msg, sizeof(msg)));
}

Secret secretOf(uint8_t seed) {
  Secret s{};
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = static_cast<uint8_t>(seed + 31 * i);
  return s;
}

TEST(AuthTag, IsTwoSipHashesOverDomainNulMessage) {
  // Independent statement of the documented construction.
  const Secret s = secretOf(3);
  const std::string domain = "hello";
  const uint8_t data[] = {9, 8, 7};
  std::vector<uint8_t> message(domain.begin(), domain.end());
  message.push_back(0);
  message.insert(message.end(), data, data + 3);
  const uint64_t lo = sipHash24(s.data(), message.data(), message.size());
  const uint64_t hi = sipHash24(s.data() + 16, message.data(), message.size());
  AuthTag expected{};
  for (int i = 0; i < 8; ++i) {
    expected[i] = static_cast<uint8_t>(lo >> (8 * i));
    expected[8 + i] = static_cast<uint8_t>(hi >> (8 * i));
  }
  EXPECT_EQ(authTag(s, "hello", data, 3), expected);
}

TEST(AuthTag, DependsOnDomainSecretAndMessage) {
  const Secret s = secretOf(1);
  const uint8_t data[] = {1, 2, 3, 4};
  const AuthTag base = authTag(s, "connect", data, sizeof(data));
  EXPECT_EQ(authTag(s, "connect", data, sizeof(data)), base);  // deterministic
  EXPECT_TRUE(tagsEqual(base, authTag(s, "connect", data, sizeof(data))));
  EXPECT_FALSE(tagsEqual(base, authTag(s, "accept", data, sizeof(data))));
  EXPECT_FALSE(tagsEqual(base, authTag(secretOf(2), "connect", data, sizeof(data))));
  uint8_t other[] = {1, 2, 3, 5};
  EXPECT_FALSE(tagsEqual(base, authTag(s, "connect", other, sizeof(other))));
  EXPECT_FALSE(tagsEqual(base, authTag(s, "connect", data, 3)));
  // Each half of the secret matters (one half per 64-bit half of the tag).
  for (size_t i : {size_t{0}, size_t{15}, size_t{16}, size_t{31}}) {
    Secret t = s;
    t[i] ^= 0x80;
    const AuthTag changed = authTag(t, "connect", data, sizeof(data));
    EXPECT_FALSE(tagsEqual(base, changed)) << "secret byte " << i;
    const bool lowHalfSame = std::memcmp(base.data(), changed.data(), 8) == 0;
    EXPECT_EQ(lowHalfSame, i >= 16) << "secret byte " << i;
  }
  // The domain separator: ("ab", "c...") and ("a", "bc...") must not collide.
  const uint8_t c[] = {'c'};
  const uint8_t bc[] = {'b', 'c'};
  EXPECT_FALSE(tagsEqual(authTag(s, "ab", c, 1), authTag(s, "a", bc, 2)));
}

TEST(AuthTag, EmptyMessage) {
  const Secret s = secretOf(5);
  const uint8_t dummy = 0;
  const AuthTag a = authTag(s, "d", &dummy, 0);
  const AuthTag b = authTag(s, "d", &dummy, 0);
  EXPECT_TRUE(tagsEqual(a, b));
  EXPECT_FALSE(tagsEqual(a, authTag(s, "e", &dummy, 0)));
}

TEST(TagsEqual, EveryByteCounts) {
  AuthTag a{};
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<uint8_t>(i * 17);
  EXPECT_TRUE(tagsEqual(a, a));
  for (size_t i = 0; i < a.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      AuthTag b = a;
      b[i] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_FALSE(tagsEqual(a, b)) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(Secrets, RandomAndDerived) {
  const Secret a = randomSecret(), b = randomSecret();
  EXPECT_NE(a, b);
  EXPECT_NE(a, Secret{});
  EXPECT_EQ(deriveSecret("passphrase"), deriveSecret("passphrase"));
  EXPECT_NE(deriveSecret("passphrase"), deriveSecret("passphrasf"));
  EXPECT_NE(deriveSecret(""), deriveSecret(std::string(1, '\0')));
  // The four 8-byte words come from distinct keys: they are not all equal.
  const Secret d = deriveSecret("x");
  std::set<uint64_t> words;
  for (int i = 0; i < 4; ++i) {
    uint64_t w;
    std::memcpy(&w, d.data() + 8 * i, 8);
    words.insert(w);
  }
  EXPECT_EQ(words.size(), 4u);
}

}  // namespace
}  // namespace gs
