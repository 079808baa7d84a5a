#include "common/auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace gs {
namespace {

inline uint64_t rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

inline uint64_t load64le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  void absorb(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

}  // namespace

uint64_t sipHash24(const uint8_t key[16], const void* data, size_t len) {
  const uint64_t k0 = load64le(key), k1 = load64le(key + 8);
  SipState s{k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL, k0 ^ 0x6c7967656e657261ULL,
             k1 ^ 0x7465646279746573ULL};
  const auto* in = static_cast<const uint8_t*>(data);
  size_t full = len / 8 * 8;
  for (size_t i = 0; i < full; i += 8)
    s.absorb(load64le(in + i));
  uint8_t last[8] = {};
  memcpy(last, in + full, len - full);
  uint64_t tail = load64le(last) | (static_cast<uint64_t>(len & 0xff) << 56);
  s.absorb(tail);
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i)
    s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

AuthTag authTag(const Secret& secret, const char* domain, const void* data, size_t len) {
  std::string message(domain);
  message.push_back('\0');
  message.append(static_cast<const char*>(data), len);
  AuthTag tag{};
  for (int half = 0; half < 2; ++half) {
    uint64_t h = sipHash24(secret.data() + 16 * half, message.data(), message.size());
    memcpy(tag.data() + 8 * half, &h, 8);
  }
  return tag;
}

bool tagsEqual(const AuthTag& a, const AuthTag& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= a[i] ^ b[i];
  return diff == 0;
}

Secret randomSecret() {
  Secret s{};
  size_t got = 0;
  while (got < s.size()) {
    ssize_t n = getrandom(s.data() + got, s.size() - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    GS_CHECK(n > 0, Errc::kSystem, "getrandom failed: %s", strerror(errno));
    got += static_cast<size_t>(n);
  }
  return s;
}

Secret deriveSecret(const std::string& material) {
  // Expand the material into 32 bytes with SipHash under fixed, distinct keys.
  Secret s{};
  for (int i = 0; i < 4; ++i) {
    uint8_t key[16] = {'g', 's', '-', 's', 'e', 'c', 'r', 'e',
                       't', '-', 'k', 'e', 'y', '-', '0', static_cast<uint8_t>('0' + i)};
    uint64_t h = sipHash24(key, material.data(), material.size());
    memcpy(s.data() + 8 * i, &h, 8);
  }
  return s;
}

}  // namespace gs
