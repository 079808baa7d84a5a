// libFuzzer target for validateChunk: a 64-byte header, an expectation and an arrival length from
// the input. Whenever the header is accepted, every invariant the receiver relies on must hold,
// and the chunk's codec must decode the bytes that follow without reading past them (a chunk left
// in the sender's memory has no bytes to decode: only its reference arrived).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "codecs/chunk_validation.h"
#include "codecs/codec.h"

using namespace gs;
using namespace gs::codecs;
using namespace gs::format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(ChunkHeader) + 4)
    return 0;
  ChunkHeader h;
  std::memcpy(&h, data, sizeof(h));
  const uint8_t* rest = data + sizeof(h) + 4;
  const size_t restSize = size - sizeof(h) - 4;
  // The expectation mirrors the header (so acceptance is reachable) except where the input says.
  ChunkExpectation e{};
  const uint8_t sel = data[sizeof(h)];
  e.collectiveId = h.collectiveId ^ (sel & 1);
  e.step = h.step;
  e.dtype = static_cast<uint8_t>(data[sizeof(h) + 1] % kNumDataTypes);
  e.sequence = h.sequence;
  e.chunkIndex = h.chunkIndex;
  e.elementCount = h.elementCount % 4097;
  e.elementOffset = h.elementOffset;
  e.totalCount = h.totalCount;
  e.collective = h.collective;
  e.reduceOp = h.reduceOp;
  e.elementSize = elementSize(static_cast<DataType>(e.dtype)) << ((sel >> 1) & 1);
  const size_t arrived = sizeof(ChunkHeader) + restSize + ((sel >> 2) & 1);
  const char* why = validateChunk(h, e, arrived);
  if (why != nullptr)
    return 0;
  // Accepted: the documented invariants. A chunk left in the sender's memory
  // (kChunkFlagPeerMemory) carries only its reference: raw, sized by its count, nothing to decode.
  if ((h.flags & kChunkFlagPeerMemory) != 0) {
    if (h.magic != kChunkMagic || h.version != kChunkVersion ||
        h.codec != static_cast<uint8_t>(CodecId::kRaw) || h.metaBytes != 0 || h.dtype != e.dtype ||
        h.elementCount != e.elementCount ||
        uint64_t{h.payloadBytes} != uint64_t{h.elementCount} * e.elementSize ||
        arrived != sizeof(ChunkHeader) + sizeof(PeerMemoryRef))
      std::abort();
    return 0;
  }
  if (h.magic != kChunkMagic || h.version != kChunkVersion || h.codec >= kNumCodecIds ||
      h.dtype != e.dtype || h.elementCount != e.elementCount ||
      sizeof(ChunkHeader) + uint64_t{h.metaBytes} + h.payloadBytes != arrived ||
      uint64_t{h.metaBytes} + h.payloadBytes > uint64_t{h.elementCount} * e.elementSize + 4096)
    std::abort();
  // The bytes after the header (as many as arrived; the input may be one short, zero-filled),
  // exactly sized, through the codec's decoder.
  const size_t n = h.metaBytes + size_t{h.payloadBytes};
  std::unique_ptr<uint8_t[]> in(new uint8_t[n ? n : 1]());
  if (n)
    std::memcpy(in.get(), rest, n < restSize ? n : restSize);
  CodecSpec spec;
  spec.id = static_cast<CodecId>(h.codec);
  const auto codec = makeCodec(spec);
  const auto dt = static_cast<DataType>(h.dtype);
  std::unique_ptr<uint8_t[]> dst(new uint8_t[h.elementCount * elementSize(dt) + 1]);
  (void)codec->decode({.dtype = dt,
                       .count = h.elementCount,
                       .bytes = in.get(),
                       .metaBytes = h.metaBytes,
                       .payloadBytes = h.payloadBytes},
                      dst.get());
  return 0;
}
