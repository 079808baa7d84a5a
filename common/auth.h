#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gs {

/// The communicator secret: 32 random bytes from the unique id (or GS_SECRET).
using Secret = std::array<uint8_t, 32>;
/// A 128-bit message authentication tag.
using AuthTag = std::array<uint8_t, 16>;

/// SipHash-2-4 (Aumasson & Bernstein, "SipHash: a fast short-input PRF", 2012) of data under
/// a 128-bit key. Used as a keyed MAC: peers prove they hold the secret without sending it.
uint64_t sipHash24(const uint8_t key[16], const void* data, size_t len);

/// Tag = two SipHash-2-4 values under the two 128-bit halves of the secret, over a domain
/// string (what is being authenticated) followed by the message.
AuthTag authTag(const Secret& secret, const char* domain, const void* data, size_t len);

/// Constant-time comparison of two tags.
bool tagsEqual(const AuthTag& a, const AuthTag& b);

/// 32 bytes from the operating system's random source (getrandom); throws kSystem on failure.
Secret randomSecret();

/// Derives a secret from a passphrase (GS_SECRET) or, lacking one, from public facts.
Secret deriveSecret(const std::string& material);

}  // namespace gs
