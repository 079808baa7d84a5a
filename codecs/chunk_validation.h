#pragma once

// The receiver's check of an arrived chunk (format/chunk_header.h): in codecs/ rather than with
// the layout because the encoded sizes it accepts follow from the codecs (checkEncodedSizes).

#include <cstddef>
#include <cstdint>

#include "format/chunk_header.h"

namespace gs::codecs {

/// What the receiver expects of the next chunk on a link.
struct ChunkExpectation {
  uint32_t collectiveId;
  uint16_t step;
  uint8_t dtype;
  uint64_t sequence;
  uint32_t chunkIndex;
  uint32_t elementCount;
  uint64_t elementOffset;
  uint64_t totalCount;
  uint8_t collective;
  uint8_t reduceOp;
  size_t elementSize;
};

/// Checks a received header against what the schedule expects and against the number of
/// bytes that actually arrived. Returns nullptr when valid, else a static string naming the
/// first mismatching field (the caller adds peer and values to the message). A chunk with
/// kChunkFlagPeerMemory is valid with just the header and its PeerMemoryRef arrived; the caller
/// checks the reference against payloadBytes before it copies.
const char* validateChunk(const format::ChunkHeader& header,
                          const ChunkExpectation& expected,
                          size_t bytesArrived);

}  // namespace gs::codecs
