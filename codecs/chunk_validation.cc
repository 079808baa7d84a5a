#include "codecs/chunk_validation.h"

#include "codecs/codec.h"

namespace gs::codecs {

using format::ChunkHeader;
using format::CodecId;
using format::kChunkMagic;
using format::kChunkVersion;
using format::kNumCodecIds;

const char* validateChunk(const ChunkHeader& h, const ChunkExpectation& e, size_t bytesArrived) {
  if (bytesArrived < sizeof(ChunkHeader))
    return "chunk shorter than its header";
  if (h.magic != kChunkMagic)
    return "bad magic";
  if (h.version != kChunkVersion)
    return "unsupported chunk version";
  if (h.codec >= kNumCodecIds)
    return "unknown codec";
  if ((h.flags & ~format::kChunkFlagPeerMemory) != 0)
    return "unknown flags";
  for (uint8_t b : h.reserved) {
    if (b != 0)
      return "reserved bytes are not zero";
  }
  if (h.collective != e.collective)
    return "collective differs (ranks called different collectives)";
  if (h.totalCount != e.totalCount)
    return "count differs between ranks";
  if (h.reduceOp != e.reduceOp)
    return "reduction op differs between ranks";
  if (h.dtype != e.dtype)
    return "dtype differs between ranks";
  if (h.collectiveId != e.collectiveId)
    return "collective sequence differs (ranks called different collectives)";
  if (h.sequence != e.sequence)
    return "link sequence number out of order";
  if (h.chunkIndex != e.chunkIndex)
    return "chunk index differs";
  if (h.elementCount != e.elementCount || h.elementOffset != e.elementOffset)
    return "element count differs between ranks (mismatched counts?)";
  if (h.codec == static_cast<uint8_t>(CodecId::kRaw)) {
    if (h.metaBytes != 0)
      return "raw chunk carries metadata";
    if (static_cast<uint64_t>(h.payloadBytes) !=
        static_cast<uint64_t>(h.elementCount) * e.elementSize)
      return "payload size does not match element count";
  } else {
    // Lossy codecs: sizes follow from the codec, the dtype and the count (codecs/codec.h); the
    // decoder validates the metadata's content.
    if (e.elementSize != elementSize(static_cast<DataType>(h.dtype)))
      return "element size does not match dtype for a compressed codec";
    if (const char* why = checkEncodedSizes(h.codec, static_cast<DataType>(h.dtype), h.elementCount,
                                            h.metaBytes, h.payloadBytes))
      return why;
  }
  if ((h.flags & format::kChunkFlagPeerMemory) != 0) {
    // Only the header and where the payload is arrived (format::kChunkFlagPeerMemory).
    if (h.codec != static_cast<uint8_t>(CodecId::kRaw))
      return "a chunk left in the sender's memory must be raw";
    if (bytesArrived != sizeof(ChunkHeader) + sizeof(format::PeerMemoryRef))
      return "chunk left in the sender's memory: length does not match a reference";
    return nullptr;
  }
  if (sizeof(ChunkHeader) + static_cast<uint64_t>(h.metaBytes) + h.payloadBytes != bytesArrived)
    return "chunk length does not match bytes received";
  return nullptr;
}

}  // namespace gs::codecs
