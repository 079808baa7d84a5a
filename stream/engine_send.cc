// Engine::Run, send path: chunk headers, encoding (with error feedback and sampled error)
// and posting each chunk as one write-with-immediate into the peer's slot.
#include <algorithm>
#include <cstring>

#include "codecs/reduce.h"
#include "common/cycle_clock.h"
#include "common/error.h"
#include "common/log.h"
#include "stream/engine_run.h"

namespace gs::stream {

// Seed of stochastic rounding: the same on every run of the same chunk, different per chunk.
uint64_t Engine::Run::seedOf(const SendOp& op) const {
  return (static_cast<uint64_t>(callIdOf(op.message)) << 40) ^
         (static_cast<uint64_t>(engine.rank_) << 24) ^ (static_cast<uint64_t>(op.step) << 32) ^
         op.chunkIndex;
}

bool Engine::Run::postSends(size_t li) {
  LinkRun& lr = links[li];
  Link& link = *lr.link;
  bool progress = false;
  // Only to a peer this run receives nothing from: where its chunks also arrive on the link, a
  // long write keeps them waiting (tcp, 2 ranks, 4 MiB sendrecv: 2.3 ms a call gathered against
  // 1.7-1.9 with a write per chunk).
  Gather gather(link.connection(), lr.queues->recvs.empty());
  while (lr.posted < lr.queues->sends.size()) {
    SendOp& op = lr.queues->sends[lr.posted];
    if (!satisfied(op.depBegin, op.depEnd))
      break;
    if (!link.hasCredit()) {
      if (lr.creditBlockedSince == 0)
        lr.creditBlockedSince = cycle::now();
      break;
    }
    const uint64_t seq = link.sendSequence;
    const size_t slot = link.slotOf(seq);
    if (link.headerBusy[slot])
      break;
    transport::LocalSegment segs[2];
    size_t nsegs = 1;
    uint32_t wireBytes = 0;
    bool peerRead = false;
    const codecs::Codec* codec = codecOn(li);
    const PlanMessage& msg = messageOf(op.message);
    const bool encode = op.forwardLink < 0 && codec != nullptr && op.count > 0 && !op.raw;
    if (encode) {
      gather.end();  // what is held leaves before this chunk's encoding
      // Header, metadata and payload contiguous in this slot's staging: one segment.
      uint8_t* out = link.encodeStaging(slot);
      const uint64_t encodeStart = nowNs();
      const codecs::EncodedSize size = codec->encode(msg.dtype, op.source, op.count,
                                                     out + sizeof(format::ChunkHeader), seedOf(op));
      if (lr.counters != nullptr)
        lr.counters->addEncodeTime(elapsedNs(encodeStart, nowNs()));
      fillHeader(reinterpret_cast<format::ChunkHeader*>(out), op, seq,
                 static_cast<uint8_t>(codec->id()), size.metaBytes, size.payloadBytes);
      wireBytes = size.metaBytes + size.payloadBytes;
      segs[0] = {&link.encodeRegion(), slot * link.layout().slotBytes(),
                 sizeof(format::ChunkHeader) + wireBytes};
    } else {
      auto* h = reinterpret_cast<format::ChunkHeader*>(link.headerStaging(slot));
      segs[0] = {&link.headerRegion(), slot * Link::kHeaderStride, sizeof(format::ChunkHeader)};
      // Where the raw payload lies in our memory when the peer may copy it from there itself.
      const uint8_t* inOurMemory = nullptr;
      if (op.forwardLink >= 0) {
        // Exactly the bytes that arrived (or were re-encoded) in the receive slot.
        LinkRun& from = links[op.forwardLink];
        const RecvOp& src = from.queues->recvs[op.forwardIndex];
        fillHeader(h, op, seq, src.slotCodec, src.slotMetaBytes, src.slotPayloadBytes);
        wireBytes = src.slotMetaBytes + src.slotPayloadBytes;
        const size_t fslot = from.link->slotOf(from.recvBase + op.forwardIndex);
        segs[1] = {&from.link->recvSlotsRegion(),
                   fslot * from.link->layout().slotBytes() + sizeof(format::ChunkHeader),
                   wireBytes};
        // Copied straight into place out of the previous rank's memory: the slot holds nothing,
        // the next rank copies it out of ours (processRecvs checked this link allows that).
        if (src.inDst)
          inOurMemory = src.dst;
      } else {
        wireBytes = static_cast<uint32_t>(op.count * msg.elementSize);
        fillHeader(h, op, seq, static_cast<uint8_t>(format::CodecId::kRaw), 0, wireBytes);
        segs[1] = {op.region, op.regionOffset, wireBytes};
        if (op.peerCopies)
          inOurMemory = op.source;
      }
      peerRead = inOurMemory != nullptr && leftForPeer(op, wireBytes, link);
      if (peerRead) {
        // Single copy: the peer copies the payload out of our memory itself; only the header
        // and where the payload is travel (format::kChunkFlagPeerMemory).
        h->flags = format::kChunkFlagPeerMemory;
        const format::PeerMemoryRef ref{reinterpret_cast<uintptr_t>(inOurMemory), wireBytes};
        memcpy(link.headerStaging(slot) + sizeof(format::ChunkHeader), &ref, sizeof(ref));
        segs[0].length += sizeof(ref);
      } else if (op.forwardLink >= 0 &&
                 links[op.forwardLink].queues->recvs[op.forwardIndex].inDst) {
        fail(Errc::kInternal, engine.rank_, "a chunk to forward is not in its slot");
      }
      nsegs = wireBytes > 0 && !peerRead ? 2 : 1;
    }
    if (!encode)
      gather.hold();
    const size_t dstOffset = slot * link.layout().slotBytes();
    PostResult r = link.connection().postWrite(
        std::span<const transport::LocalSegment>(segs, nsegs), link.peerSlots, dstOffset,
        makeImm(ImmTag::kData, static_cast<uint32_t>(slot)),
        workId(WorkKind::kData, li, lr.posted));
    if (r == PostResult::kWouldBlock)
      break;
    if (r == PostResult::kError)
      connectionFailed(li);
    const bool sample = encode && sampleError(*codec);
    if (encode && (op.replica != nullptr || args.residual != nullptr || sample)) {
      const uint8_t* enc = link.encodeStaging(slot);
      uint8_t* decoded = engine.scratch(1);
      decodeOwn(reinterpret_cast<const format::ChunkHeader*>(enc),
                enc + sizeof(format::ChunkHeader), msg.dtype, op.count, decoded);
      if (sample)
        recordError(lr, codec->id(), msg.dtype, op.source, decoded, op.count);
      if (args.residual != nullptr) {
        void* res = residualAt(op.source);
        codecs::updateResidual(args.dtype, op.source, decoded, res, op.count);
        // An averaged block lost this much per rank's share: the residual is added back to
        // one rank's contribution to a sum, so it counts N times.
        if (args.op == ReduceOp::kAvg && op.replica != nullptr)
          scaleResidual(res, op.count, static_cast<double>(engine.nranks_));
      }
      // Our own copy becomes what every other rank decodes: replicas stay bit-identical.
      if (op.replica != nullptr)
        memcpy(op.replica, decoded, op.count * elementSize);
    }
    link.headerBusy[slot] = 1;
    op.peerRead = peerRead;
    if (peerRead)
      op.readOrdinal = link.peerReadsPosted++;
    ++link.sendSequence;
    ++lr.posted;
    lr.logicalBytesSent += op.count * msg.elementSize;
    if (lr.counters != nullptr) {
      // The metrics' chunk and credit waits, timed by the cycle counter: two clock reads per
      // chunk were a share of a small message's own time where ranks outnumber cores.
      op.postedTicks = cycle::now();
      lr.counters->onChunkSent(
          op.count * msg.elementSize, sizeof(format::ChunkHeader) + wireBytes,
          encode
              ? static_cast<int>(codec->id())
              : static_cast<int>(
                    reinterpret_cast<const format::ChunkHeader*>(link.headerStaging(slot))->codec));
      if (lr.creditBlockedSince != 0)
        lr.counters->addCreditWait(cycle::ticksToNs(op.postedTicks - lr.creditBlockedSince));
    }
    lr.creditBlockedSince = 0;
    engine.stats_.chunksSent++;
    engine.stats_.bytesSent += sizeof(format::ChunkHeader) + wireBytes;
    engine.stats_.bytesLogical += op.count * msg.elementSize;
    progress = true;
  }
  return progress;
}

void Engine::Run::onSendComplete(size_t li, size_t index) {
  LinkRun& lr = links[li];
  if (index >= lr.posted || lr.sendDone[index])
    fail(Errc::kInternal, engine.rank_, "stray send completion");
  Link& link = *lr.link;
  link.headerBusy[link.slotOf(lr.sendBase + index)] = 0;
  const SendOp& op = lr.queues->sends[index];
  if (op.peerRead && link.peerReadsDone <= op.readOrdinal) {
    lr.awaitingRead.push_back(index);  // our buffer is in use until the peer copied it
    return;
  }
  finishSend(li, index);
}

void Engine::Run::onReadAck(size_t li) {
  LinkRun& lr = links[li];
  while (lr.awaitingReadHead < lr.awaitingRead.size()) {
    const size_t index = lr.awaitingRead[lr.awaitingReadHead];
    if (lr.link->peerReadsDone <= lr.queues->sends[index].readOrdinal)
      break;
    ++lr.awaitingReadHead;
    finishSend(li, index);
  }
}

void Engine::Run::finishSend(size_t li, size_t index) {
  LinkRun& lr = links[li];
  lr.sendDone[index] = 1;
  const SendOp& op = lr.queues->sends[index];
  if (lr.counters != nullptr)
    lr.counters->onChunkCompleted(cycle::ticksToNs(cycle::now() - op.postedTicks));
  if (op.forwardLink >= 0)
    ++links[op.forwardLink].queues->recvs[op.forwardIndex].forwardsDone;
  while (lr.completed < lr.posted && lr.sendDone[lr.completed])
    ++lr.completed;
}

// Decodes a chunk this rank encoded itself (cannot fail unless the codec is broken).
void Engine::Run::decodeOwn(const format::ChunkHeader* h,
                            const uint8_t* encoded,
                            DataType dtype,
                            uint32_t count,
                            uint8_t* out) {
  const codecs::EncodedChunk own{.codec = h->codec,
                                 .dtype = dtype,
                                 .count = count,
                                 .bytes = encoded,
                                 .metaBytes = h->metaBytes,
                                 .payloadBytes = h->payloadBytes};
  if (const char* why = engine.decoder(h->codec).decode(own, out))
    fail(Errc::kInternal, engine.rank_, formatString("own chunk does not decode: %s", why));
}

// Numerics guardrail: every errorSampleEvery_-th lossy chunk is decoded back and compared.
bool Engine::Run::sampleError(const codecs::Codec& codec) const {
  if (codec.id() == format::CodecId::kRaw || engine.errorSampleEvery_ == 0)
    return false;
  return engine.lossyChunks_++ % engine.errorSampleEvery_ == 0;
}

void Engine::Run::recordError(LinkRun& lr,
                              format::CodecId id,
                              DataType dtype,
                              const void* values,
                              const void* decoded,
                              uint32_t count) const {
  if (lr.counters != nullptr) {
    lr.counters->onErrorSample(static_cast<int>(id),
                               codecs::relativeError(dtype, values, decoded, count));
  }
}

void Engine::Run::scaleResidual(void* residual, size_t count, double factor) const {
  if (codecs::residualElementSize(args.dtype) == sizeof(double)) {
    auto* r = static_cast<double*>(residual);
    for (size_t i = 0; i < count; ++i)
      r[i] *= factor;
  } else {
    auto* r = static_cast<float*>(residual);
    for (size_t i = 0; i < count; ++i)
      r[i] = static_cast<float>(r[i] * factor);
  }
}

// Residual element of a buffer element, by its address in the send or the recv buffer.
void* Engine::Run::residualAt(const void* element) const {
  const auto* e = static_cast<const uint8_t*>(element);
  const auto* recv = static_cast<const uint8_t*>(args.recv);
  const auto* base = e >= recv && e < recv + args.count * elementSize
                         ? recv
                         : static_cast<const uint8_t*>(args.send);
  const size_t index = static_cast<size_t>(e - base) / elementSize;
  return static_cast<uint8_t*>(args.residual) + index * codecs::residualElementSize(args.dtype);
}

}  // namespace gs::stream
