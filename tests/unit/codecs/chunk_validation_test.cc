// validateChunk: a valid header passes; each single-field corruption is rejected; random
// headers never crash and are accepted only when every documented invariant holds.
#include "codecs/chunk_validation.h"

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/types.h"

namespace gs::codecs {

using namespace format;  // the layout under test (format/chunk_header.h)
namespace {

struct Case {
  ChunkHeader header;
  ChunkExpectation expect;
  size_t bytes;
};

Case validCase(uint32_t elements = 100, size_t esize = 4) {
  Case c{};
  std::memset(&c.header, 0, sizeof(c.header));
  ChunkHeader& h = c.header;
  // Built from the documented layout ("GSCK" little-endian, version 1, raw codec 0).
  const char magic[4] = {'G', 'S', 'C', 'K'};
  std::memcpy(&h.magic, magic, 4);
  h.version = 1;
  h.codec = 0;
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.collectiveId = 17;
  h.step = 3;
  h.sequence = 123456789012ull;
  h.chunkIndex = 5;
  h.elementCount = elements;
  h.metaBytes = 0;
  h.payloadBytes = static_cast<uint32_t>(elements * esize);
  h.elementOffset = 5ull * elements;
  h.totalCount = 1000000;
  h.collective = 0;
  h.reduceOp = static_cast<uint8_t>(ReduceOp::kSum);
  c.expect = ChunkExpectation{17,
                              3,
                              static_cast<uint8_t>(DataType::kFloat32),
                              123456789012ull,
                              5,
                              elements,
                              5ull * elements,
                              1000000,
                              0,
                              static_cast<uint8_t>(ReduceOp::kSum),
                              esize};
  c.bytes = 64 + elements * esize;
  return c;
}

TEST(ChunkHeader, LayoutMatchesTheDocumentedOffsets) {
  EXPECT_EQ(sizeof(ChunkHeader), 64u);
  EXPECT_EQ(offsetof(ChunkHeader, version), 4u);
  EXPECT_EQ(offsetof(ChunkHeader, codec), 6u);
  EXPECT_EQ(offsetof(ChunkHeader, dtype), 7u);
  EXPECT_EQ(offsetof(ChunkHeader, collectiveId), 8u);
  EXPECT_EQ(offsetof(ChunkHeader, step), 12u);
  EXPECT_EQ(offsetof(ChunkHeader, flags), 14u);
  EXPECT_EQ(offsetof(ChunkHeader, sequence), 16u);
  EXPECT_EQ(offsetof(ChunkHeader, chunkIndex), 24u);
  EXPECT_EQ(offsetof(ChunkHeader, elementCount), 28u);
  EXPECT_EQ(offsetof(ChunkHeader, metaBytes), 32u);
  EXPECT_EQ(offsetof(ChunkHeader, payloadBytes), 36u);
  EXPECT_EQ(offsetof(ChunkHeader, elementOffset), 40u);
  EXPECT_EQ(offsetof(ChunkHeader, totalCount), 48u);
  EXPECT_EQ(offsetof(ChunkHeader, collective), 56u);
  EXPECT_EQ(offsetof(ChunkHeader, reduceOp), 57u);
  EXPECT_EQ(offsetof(ChunkHeader, reserved), 58u);
  EXPECT_EQ(kChunkMagic, 0x4b435347u);
  EXPECT_EQ(kChunkVersion, 1);
}

TEST(ChunkHeader, ValidPasses) {
  for (uint32_t n : {0u, 1u, 100u, 262144u}) {
    for (size_t es : {size_t{1}, size_t{2}, size_t{4}, size_t{8}}) {
      Case c = validCase(n, es);
      EXPECT_EQ(validateChunk(c.header, c.expect, c.bytes), nullptr) << n << " x " << es;
    }
  }
}

struct Corruption {
  const char* name;
  std::function<void(Case&)> apply;
  const char* mentions;  // a word the reason should contain
};

TEST(ChunkHeader, EverySingleFieldCorruptionIsRejected) {
  const std::vector<Corruption> corruptions = {
      {"magic", [](Case& c) { c.header.magic ^= 1; }, "magic"},
      {"magic zero", [](Case& c) { c.header.magic = 0; }, "magic"},
      {"magic byte-swapped", [](Case& c) { c.header.magic = __builtin_bswap32(kChunkMagic); },
       "magic"},
      {"version 0", [](Case& c) { c.header.version = 0; }, "version"},
      {"version 2", [](Case& c) { c.header.version = 2; }, "version"},
      {"codec", [](Case& c) { c.header.codec = 1; }, "codec"},
      {"codec 255", [](Case& c) { c.header.codec = 255; }, "codec"},
      {"dtype", [](Case& c) { c.header.dtype = static_cast<uint8_t>(DataType::kInt32); }, "dtype"},
      {"dtype invalid", [](Case& c) { c.header.dtype = 200; }, "dtype"},
      {"collectiveId", [](Case& c) { c.header.collectiveId = 18; }, "collective"},
      {"collective kind", [](Case& c) { c.header.collective = 2; }, "collective"},
      {"reduceOp", [](Case& c) { c.header.reduceOp = static_cast<uint8_t>(ReduceOp::kMax); }, "op"},
      {"sequence +1", [](Case& c) { c.header.sequence += 1; }, "sequence"},
      {"sequence -1", [](Case& c) { c.header.sequence -= 1; }, "sequence"},
      {"sequence high bit", [](Case& c) { c.header.sequence ^= 1ull << 63; }, "sequence"},
      {"chunkIndex", [](Case& c) { c.header.chunkIndex = 6; }, "chunk"},
      {"elementCount (payload kept consistent)",
       [](Case& c) {
         c.header.elementCount = 99;
         c.header.payloadBytes = 99 * 4;
         c.bytes = 64 + 396;
       },
       "count"},
      {"elementCount only", [](Case& c) { c.header.elementCount = 101; }, "count"},
      {"elementOffset", [](Case& c) { c.header.elementOffset += 1; }, "count"},
      {"totalCount", [](Case& c) { c.header.totalCount = 999999; }, "count"},
      {"metaBytes",
       [](Case& c) {
         c.header.metaBytes = 8;
         c.bytes += 8;
       },
       "metadata"},
      {"metaBytes huge", [](Case& c) { c.header.metaBytes = 0xffffffffu; }, "metadata"},
      {"payloadBytes +1",
       [](Case& c) {
         c.header.payloadBytes += 1;
         c.bytes += 1;
       },
       "payload"},
      {"payloadBytes -4",
       [](Case& c) {
         c.header.payloadBytes -= 4;
         c.bytes -= 4;
       },
       "payload"},
      {"payloadBytes huge", [](Case& c) { c.header.payloadBytes = 0xffffffffu; }, "payload"},
      {"bytesArrived short by one", [](Case& c) { c.bytes -= 1; }, "length"},
      {"bytesArrived long by one", [](Case& c) { c.bytes += 1; }, "length"},
      {"bytesArrived header only", [](Case& c) { c.bytes = 64; }, "length"},
      {"bytesArrived below header", [](Case& c) { c.bytes = 63; }, "header"},
      {"bytesArrived zero", [](Case& c) { c.bytes = 0; }, "header"},
      {"bytesArrived huge", [](Case& c) { c.bytes = SIZE_MAX; }, "length"},
  };
  for (const Corruption& k : corruptions) {
    Case c = validCase();
    ASSERT_EQ(validateChunk(c.header, c.expect, c.bytes), nullptr);
    k.apply(c);
    const char* why = validateChunk(c.header, c.expect, c.bytes);
    ASSERT_NE(why, nullptr) << k.name << " was accepted";
    EXPECT_NE(std::string(why).find(k.mentions), std::string::npos)
        << k.name << ": reason '" << why << "' does not mention " << k.mentions;
  }
}

// kChunkFlagPeerMemory: only the header and a PeerMemoryRef arrive; everything else about the
// chunk is checked as for any chunk, and only raw chunks may be left in the sender's memory.
TEST(ChunkHeader, ChunkLeftInTheSendersMemoryCarriesOnlyItsReference) {
  Case c = validCase(262144, 4);
  c.header.flags = kChunkFlagPeerMemory;
  c.bytes = 64 + sizeof(PeerMemoryRef);
  EXPECT_EQ(validateChunk(c.header, c.expect, c.bytes), nullptr);
  auto rejects = [](Case k, const char* mentions) {
    const char* why = validateChunk(k.header, k.expect, k.bytes);
    ASSERT_NE(why, nullptr) << mentions;
    EXPECT_NE(std::string(why).find(mentions), std::string::npos) << why;
  };
  Case full = c;
  full.bytes = 64 + full.header.payloadBytes;  // the payload came too: not a reference
  rejects(full, "reference");
  Case encoded = c;
  encoded.header.codec = static_cast<uint8_t>(CodecId::kBf16);
  encoded.header.payloadBytes = encoded.header.elementCount * 2;  // a consistent bf16 chunk
  rejects(encoded, "raw");
  Case unknown = c;
  unknown.header.flags = 2;
  rejects(unknown, "flags");
  Case miscounted = c;
  miscounted.header.payloadBytes += 4;  // still checked against the element count
  rejects(miscounted, "payload");
  Case otherCall = c;
  otherCall.header.collectiveId += 1;
  rejects(otherCall, "collective");
}

TEST(ChunkHeader, ElementSizeOfTheExpectationIsUsed) {
  // The same header is valid for 4-byte elements and invalid for 2-byte ones.
  Case c = validCase(10, 4);
  c.expect.elementSize = 2;
  EXPECT_NE(validateChunk(c.header, c.expect, c.bytes), nullptr);
  // A header whose elementCount * elementSize overflows 32 bits cannot match payloadBytes.
  Case big = validCase(0x40000001u, 4);  // payloadBytes wraps to 4 in 32 bits
  ASSERT_EQ(big.header.payloadBytes, 4u);
  big.bytes = 64 + 4;
  EXPECT_NE(validateChunk(big.header, big.expect, big.bytes), nullptr);
}

// Random headers (fully random, or a valid one with random bit flips) against random
// expectations: validateChunk never crashes, and whenever it accepts, every invariant the
// receiver relies on holds.
TEST(ChunkHeader, FuzzNeverCrashesAndOnlyAcceptsConsistentChunks) {
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int iter = 0; iter < 300000; ++iter) {
    Case c = validCase(static_cast<uint32_t>(rng() % 5000), size_t{1} << (rng() % 4));
    auto* raw = reinterpret_cast<uint8_t*>(&c.header);
    switch (iter % 3) {
      case 0:
        for (size_t i = 0; i < sizeof(ChunkHeader); ++i)
          raw[i] = static_cast<uint8_t>(rng());
        c.bytes = rng() % 3 == 0 ? rng() : rng() % 40000;
        break;
      case 1: {
        const int flips = 1 + static_cast<int>(rng() % 3);
        for (int f = 0; f < flips; ++f)
          raw[rng() % 64] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      }
      case 2:
        if (rng() % 2)
          c.bytes += static_cast<size_t>(rng() % 9) - 4;
        break;
    }
    const char* why = validateChunk(c.header, c.expect, c.bytes);
    if (why != nullptr) {
      ASSERT_GT(std::strlen(why), 0u);
      continue;
    }
    ++accepted;
    const ChunkHeader& h = c.header;
    const ChunkExpectation& e = c.expect;
    ASSERT_EQ(h.magic, kChunkMagic);
    ASSERT_EQ(h.version, kChunkVersion);
    ASSERT_EQ(h.codec, 0);
    ASSERT_EQ(h.dtype, e.dtype);
    ASSERT_EQ(h.collectiveId, e.collectiveId);
    ASSERT_EQ(h.sequence, e.sequence);
    ASSERT_EQ(h.chunkIndex, e.chunkIndex);
    ASSERT_EQ(h.elementCount, e.elementCount);
    ASSERT_EQ(h.elementOffset, e.elementOffset);
    ASSERT_EQ(h.totalCount, e.totalCount);
    ASSERT_EQ(h.collective, e.collective);
    ASSERT_EQ(h.reduceOp, e.reduceOp);
    ASSERT_EQ(h.metaBytes, 0u);
    ASSERT_EQ(uint64_t{h.payloadBytes}, uint64_t{h.elementCount} * e.elementSize);
    if ((h.flags & kChunkFlagPeerMemory) != 0)
      ASSERT_EQ(c.bytes, 64 + sizeof(PeerMemoryRef));
    else
      ASSERT_EQ(c.bytes, 64 + uint64_t{h.payloadBytes});
  }
  // Bit flips in step (not validated) and unchanged lengths pass.
  EXPECT_GT(accepted, 1000);
}

}  // namespace
}  // namespace gs::codecs
