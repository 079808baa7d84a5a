#pragma once

// The chunk wire format: the header every chunk starts with and the codec ids it names. Its own
// module (format/) because both sides of the codec boundary build on it: the CPU codecs and
// the engine write and check it (codecs/, stream/), and the CUDA kernels (kernels/) dispatch on
// its codec ids without depending on codecs/.

#include <cstddef>
#include <cstdint>

namespace gs::format {

/// Wire format of one chunk: this 64-byte header, then metaBytes of codec metadata (scales,
/// indices; none for raw), then payloadBytes of encoded elements. Every chunk is
/// self-describing so a receiver decodes whatever codec arrives, and validates everything
/// before use: bytes from the network are untrusted.
///
///   offset size field
///   0      4    magic          'G','S','C','K'
///   4      2    version        kChunkVersion
///   6      1    codec          CodecId
///   7      1    dtype          gs::DataType of the decoded elements
///   8      4    collectiveId   per-communicator sequence number of the collective
///   12     2    step           the sender's schedule step (diagnostics; steps of sender and
///                               receiver need not be numbered alike)
///   14     2    flags          kChunkFlagPeerMemory or 0
///   16     8    sequence       per-link chunk sequence number
///   24     4    chunkIndex     index of the chunk within its step
///   28     4    elementCount   decoded elements in this chunk
///   32     4    metaBytes      codec metadata bytes after the header
///   36     4    payloadBytes   encoded element bytes after the metadata
///   40     8    elementOffset  first element within the step's segment
///   48     8    totalCount     the collective's count argument (detects mismatched calls)
///   56     1    collective     stream::CollectiveKind
///   57     1    reduceOp       gs::ReduceOp
///   58     6    reserved       0
/// Little-endian (every supported host is).
struct ChunkHeader {
  uint32_t magic;
  uint16_t version;
  uint8_t codec;
  uint8_t dtype;
  uint32_t collectiveId;
  uint16_t step;
  uint16_t flags;
  uint64_t sequence;
  uint32_t chunkIndex;
  uint32_t elementCount;
  uint32_t metaBytes;
  uint32_t payloadBytes;
  uint64_t elementOffset;
  uint64_t totalCount;
  uint8_t collective;
  uint8_t reduceOp;
  uint8_t reserved[6];
};
static_assert(sizeof(ChunkHeader) == 64, "chunk header is 64 bytes on the wire");
static_assert(offsetof(ChunkHeader, sequence) == 16 && offsetof(ChunkHeader, elementOffset) == 40,
              "chunk header layout");

/// flags: the payload did not travel. The sender (a rank of the same host, over shared memory)
/// wrote only this header and a PeerMemoryRef after it; the receiver copies the payload straight
/// out of the sender's memory (cross-memory attach) and acknowledges it. Raw chunks only.
inline constexpr uint16_t kChunkFlagPeerMemory = 1;

/// Where a kChunkFlagPeerMemory chunk's payload is: an address in the sender's process and its
/// length, which must equal the header's payloadBytes.
struct PeerMemoryRef {
  uint64_t address;
  uint64_t bytes;
};
static_assert(sizeof(PeerMemoryRef) == 16);

inline constexpr uint32_t kChunkMagic = 0x4b435347;  // "GSCK" little-endian
inline constexpr uint16_t kChunkVersion = 1;

/// Codec of a chunk (the header's codec byte); codecs/codec.h describes each encoding.
enum class CodecId : uint8_t {
  kRaw = 0,
  kFp16 = 1,
  kBf16 = 2,
  kFp8E4M3 = 3,
  kFp8E5M2 = 4,
  kInt8 = 5,
  kInt4 = 6,
  kTopK = 7,
};
inline constexpr int kNumCodecIds = 8;

}  // namespace gs::format
