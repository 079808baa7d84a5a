// Engine::Run, receive path: validating arrivals (call mismatches become causes every rank
// reports), decoding and reducing them, re-encoding ring hops, returning credits.
#include <algorithm>
#include <cstring>

#include "codecs/chunk_validation.h"
#include "codecs/reduce.h"
#include "common/error.h"
#include "common/log.h"
#include "stream/engine_run.h"

namespace gs::stream {

// A well-formed chunk of a call that differs from this rank's (the user called different
// collectives, counts, ops or dtypes on different ranks): the cause, naming both ranks and
// both values, as every rank will report it; "" when the chunk is not of that kind. The
// header is untrusted: the name functions answer "unknown" for values out of range.
std::string Engine::Run::callMismatch(const format::ChunkHeader& h,
                                      int peer,
                                      uint64_t expectedTotal,
                                      const RecvOp& op) const {
  if (h.magic != format::kChunkMagic || h.version != format::kChunkVersion)
    return "";
  const int me = engine.rank_;
  const DataType dtype = messageOf(op.message).dtype;
  const uint32_t id = callIdOf(op.message);
  if (h.collective != static_cast<uint8_t>(args.kind)) {
    return formatString("collective differs between ranks: rank %d called %s, rank %d %s", peer,
                        collectiveName(static_cast<CollectiveKind>(h.collective)), me,
                        collectiveName(args.kind));
  }
  if (h.totalCount != expectedTotal && args.kind == CollectiveKind::kAllToAll) {
    return formatString(
        "all-to-all counts differ between ranks: rank %d sends %llu elements to rank %d, which "
        "expects %llu from it",
        peer, static_cast<unsigned long long>(h.totalCount), me,
        static_cast<unsigned long long>(expectedTotal));
  }
  if (h.totalCount != expectedTotal && args.kind == CollectiveKind::kPointToPoint) {
    return formatString(
        "message sizes differ: rank %d sends %llu elements to rank %d, whose receive (message "
        "#%u from rank %d) expects %llu",
        peer, static_cast<unsigned long long>(h.totalCount), me, id, peer,
        static_cast<unsigned long long>(expectedTotal));
  }
  if (h.totalCount != expectedTotal) {
    return formatString("count differs between ranks: rank %d called with %llu, rank %d with %zu",
                        peer, static_cast<unsigned long long>(h.totalCount), me, args.count);
  }
  if (h.reduceOp != static_cast<uint8_t>(args.op)) {
    return formatString(
        "reduction op differs between ranks: rank %d called with %s, rank %d "
        "with %s",
        peer, reduceOpName(static_cast<ReduceOp>(h.reduceOp)), me, reduceOpName(args.op));
  }
  if (h.dtype != static_cast<uint8_t>(dtype)) {
    return formatString("dtype differs between ranks: rank %d called with %s, rank %d with %s",
                        peer, dataTypeName(static_cast<DataType>(h.dtype)), me,
                        dataTypeName(dtype));
  }
  if (h.collectiveId != id && args.kind == CollectiveKind::kPointToPoint) {
    return formatString(
        "messages out of step: rank %d sent its message #%u to rank %d, which expects #%u", peer,
        h.collectiveId, me, id);
  }
  if (h.collectiveId != collectiveId) {
    return formatString(
        "ranks are at different calls: rank %d sent collective #%u, rank %d is "
        "at #%u (a rank skipped or added a call)",
        peer, h.collectiveId, me, collectiveId);
  }
  return "";
}

// Acts on a chunk through the decoder of its codec (raw included): fused decode + reduce into
// place; ring hops reduce into the slot and, in a compressed collective, re-encode there.
void Engine::Run::applyChunk(Link& link,
                             RecvOp& op,
                             const format::ChunkHeader& h,
                             uint8_t* payload) {
  const codecs::Codec& dec = engine.decoder(h.codec);
  const codecs::EncodedChunk in{.codec = h.codec,
                                .dtype = messageOf(op.message).dtype,
                                .count = op.count,
                                .bytes = payload,
                                .metaBytes = h.metaBytes,
                                .payloadBytes = h.payloadBytes};
  const char* why = nullptr;
  switch (op.action) {
    case RecvAction::kCopy:
      why = dec.decode(in, op.dst);
      break;
    case RecvAction::kReduce:
      why = dec.decodeReduce(in, {args.op, op.dst, false}, op.dst);
      break;
    case RecvAction::kReduceWith:
      why = dec.decodeReduce(in, {args.op, op.operand, op.incomingFirst}, op.dst);
      break;
    case RecvAction::kReduceToSlot: {
      // The sum leaves encoded with the codec of the link that forwards it; raw steps (and raw
      // collectives) forward it raw.
      const codecs::Codec* out =
          op.raw
              ? nullptr
              : (op.forwardedOn >= 0 ? codecOn(static_cast<size_t>(op.forwardedOn)) : args.codec);
      if (out == nullptr && h.codec == static_cast<uint8_t>(format::CodecId::kRaw)) {
        // Raw in, raw out: reduce in the slot itself (decodeReduce allows dst == its input).
        why = dec.decodeReduce(in, {args.op, op.operand, false}, payload);
        break;
      }
      uint8_t* scratch = engine.scratch(0);
      why = dec.decodeReduce(in, {args.op, op.operand, false}, scratch);
      if (why == nullptr) {
        if (out == nullptr) {
          // Raw collective (or raw step) receiving a compressed chunk: forward the sum raw.
          memcpy(payload, scratch, op.count * elementSize);
          op.slotCodec = static_cast<uint8_t>(format::CodecId::kRaw);
          op.slotMetaBytes = 0;
          op.slotPayloadBytes = static_cast<uint32_t>(op.count * elementSize);
        } else {
          reencode(op, *out, scratch, payload);
        }
      }
      break;
    }
  }
  if (why != nullptr) {
    fail(Errc::kRemote, link.peer(),
         formatString("invalid %s chunk from rank %d (step %u, chunk %u): %s",
                      codecs::codecIdName(static_cast<format::CodecId>(h.codec)), link.peer(),
                      op.step, op.chunkIndex, why));
  }
}

// Encodes a reduced chunk back into its slot for forwarding (the slot holds up to
// maxEncodedBytes after the header, see SlotLayout).
void Engine::Run::reencode(RecvOp& op,
                           const codecs::Codec& codec,
                           const uint8_t* values,
                           uint8_t* slotPayload) {
  const uint64_t encodeStart = nowNs();
  const codecs::EncodedSize size =
      codec.encode(args.dtype, values, op.count, slotPayload,
                   seedOf(SendOp{op.step, op.chunkIndex, op.elementOffset, op.count}));
  LinkRun& out = links[static_cast<size_t>(std::max(op.forwardedOn, 0))];
  if (out.counters != nullptr)
    out.counters->addEncodeTime(elapsedNs(encodeStart, nowNs()));
  op.slotCodec = static_cast<uint8_t>(codec.id());
  op.slotMetaBytes = size.metaBytes;
  op.slotPayloadBytes = size.payloadBytes;
  const bool sample = sampleError(codec);
  if (args.residual != nullptr || sample) {
    format::ChunkHeader h{};
    h.codec = op.slotCodec;
    h.metaBytes = size.metaBytes;
    h.payloadBytes = size.payloadBytes;
    uint8_t* decoded = engine.scratch(1);
    decodeOwn(&h, slotPayload, args.dtype, op.count, decoded);
    if (sample)
      recordError(out, codec.id(), args.dtype, values, decoded, op.count);
    // The values belong to the block of op.operand (this rank's contribution to it).
    if (args.residual != nullptr)
      codecs::updateResidual(args.dtype, values, decoded, residualAt(op.operand), op.count);
  }
}

bool Engine::Run::processRecvs(size_t li) {
  LinkRun& lr = links[li];
  Link& link = *lr.link;
  bool progress = false;
  bool waitsForDependencies = false;
  while (lr.processed < lr.queues->recvs.size()) {
    RecvOp& op = lr.queues->recvs[lr.processed];
    const uint64_t seq = lr.recvBase + lr.processed;
    const size_t slot = link.slotOf(seq);
    const uint32_t arrived = link.arrivedBytes[slot];
    if (arrived == Link::kNotArrived)
      break;
    if (!satisfied(op.depBegin, op.depEnd)) {
      waitsForDependencies = true;
      break;
    }
    uint8_t* base = link.slot(slot);
    format::ChunkHeader h;
    memcpy(&h, base, sizeof(h));
    const uint64_t total = totalCountOf(op.stepCount);
    const PlanMessage& msg = messageOf(op.message);
    codecs::ChunkExpectation e{callIdOf(op.message),
                               op.step,
                               static_cast<uint8_t>(msg.dtype),
                               seq,
                               op.chunkIndex,
                               op.count,
                               op.elementOffset,
                               total,
                               static_cast<uint8_t>(args.kind),
                               static_cast<uint8_t>(args.op),
                               msg.elementSize};
    if (const char* why = codecs::validateChunk(h, e, arrived)) {
      const std::string mismatch = callMismatch(h, link.peer(), total, op);
      if (!mismatch.empty())
        fail(Errc::kInvalidArgument, link.peer(), mismatch);
      fail(Errc::kRemote, link.peer(),
           formatString("invalid chunk from rank %d (step %u, chunk %u): %s (received count %llu "
                        "elements %u, expected count %zu elements %u)",
                        link.peer(), op.step, op.chunkIndex, why,
                        static_cast<unsigned long long>(h.totalCount), h.elementCount,
                        static_cast<size_t>(total), op.count));
    }
    uint8_t* payload = base + sizeof(format::ChunkHeader);
    op.slotCodec = h.codec;
    op.slotMetaBytes = h.metaBytes;
    op.slotPayloadBytes = h.payloadBytes;
    bool applied = false;
    if (link.landedInPlace[slot] != 0) {
      // The transport read the payload straight to op.dst, behind exactly the raw header
      // armLandings expected (and validateChunk has just checked): nothing to copy.
      link.landedInPlace[slot] = 0;
      applied = true;
    }
    if ((h.flags & format::kChunkFlagPeerMemory) != 0) {
      // A copy is a raw decode: straight into place, unless a forward needs it in the slot.
      op.inDst = op.action == RecvAction::kCopy && op.count > 0 && forwardsFromDst(op);
      applied = op.action == RecvAction::kCopy && (op.forwarded == 0 || op.inDst);
      readFromPeer(li, base, h, applied ? op.dst : payload);
    }
    if (op.count > 0 && !applied)  // a header-only chunk (Step::announceEmpty) writes nothing
      applyChunk(link, op, h, payload);
    if (op.finalize)
      codecs::finalizeAverage(args.dtype, args.op, op.dst, op.count, engine.nranks_);
    link.arrivedBytes[slot] = Link::kNotArrived;
    op.processed = true;
    ++lr.processed;
    engine.stats_.chunksReceived++;
    progress = true;
  }
  armLandings(li);
  // Chunks behind one that waits for its dependencies may sit in the peer's memory. (Only shm
  // leaves chunks there, and its notices arrive in order: behind one not arrived, none has.)
  if (waitsForDependencies)
    progress |= readAheadFromPeer(li);
  progress |= acknowledgeReads(li);
  return progress;
}

// A copied chunk's forward may send it from where it was copied to (its dst), for the next
// rank to copy out of our memory, when that rank can and dst keeps the value: in gathers,
// allreduce a copy writes final data, nothing overwrites it during the call (broadcast chains
// do not leave chunks in memory at all, see copiedOutByPeer in plan.cc).
// One forward only (a tree node's two children would each need the check).
bool Engine::Run::landsInPlace(const RecvOp& op) const {
  const bool raw = op.raw || (args.kind != CollectiveKind::kPointToPoint && args.codec == nullptr &&
                              !args.adaptive);
  return raw && op.action == RecvAction::kCopy && op.count > 0 && op.forwarded == 0;
}

void Engine::Run::armLandings(size_t li) {
  LinkRun& lr = links[li];
  if (!lr.lands)
    return;
  Link& link = *lr.link;
  const size_t end = std::min(lr.queues->recvs.size(), lr.processed + link.layout().slots);
  size_t i = std::max(lr.armed, lr.processed);
  for (; i < end; ++i) {
    const RecvOp& op = lr.queues->recvs[i];
    if (!landsInPlace(op))
      continue;
    if (!satisfied(op.depBegin, op.depEnd))
      break;  // not yet: a send may still read dst (in place)
    // The payload goes to dst only behind the very header this receive expects: a chunk of
    // another call (a peer that passed another dtype of the same size) lands in the slot and
    // fails validation there, leaving dst untouched as without landing.
    const uint64_t seq = lr.recvBase + i;
    const auto bytes = static_cast<uint32_t>(op.count * messageOf(op.message).elementSize);
    format::ChunkHeader expected;
    fillHeader(&expected, op, seq, static_cast<uint8_t>(format::CodecId::kRaw), 0, bytes);
    link.connection().landAt(
        link.slot(link.slotOf(seq)),
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&expected), sizeof(expected)),
        op.dst, bytes);
  }
  lr.armed = i;
}

bool Engine::Run::forwardsFromDst(const RecvOp& op) const {
  if (op.forwarded != 1 || op.forwardedOn < 0)
    return false;
  if (args.kind != CollectiveKind::kAllGather && args.kind != CollectiveKind::kAllReduce)
    return false;
  return links[static_cast<size_t>(op.forwardedOn)].link->connection().peerReadsOurMemory();
}

void Engine::Run::readFromPeer(size_t li,
                               const uint8_t* slotBase,
                               const format::ChunkHeader& h,
                               uint8_t* into) {
  Link& link = *links[li].link;
  // A peer that aborted has left its call: its buffer may already hold something else.
  if (link.abortReceived)
    raise(link.abortNotice, link.peer());
  format::PeerMemoryRef ref;
  memcpy(&ref, slotBase + sizeof(format::ChunkHeader), sizeof(ref));
  // The header was validated against this receive (its payloadBytes is what `into` holds).
  if (ref.bytes != h.payloadBytes) {
    fail(Errc::kRemote, link.peer(),
         formatString("invalid chunk from rank %d: it left %llu bytes in its memory for a "
                      "chunk of %u",
                      link.peer(), static_cast<unsigned long long>(ref.bytes), h.payloadBytes));
  }
  std::string why;
  if (!link.connection().readPeerMemory(ref.address, into, ref.bytes, &why)) {
    fail(Errc::kRemote, link.peer(),
         formatString("cannot copy a chunk out of rank %d's memory: %s", link.peer(), why.c_str()));
  }
  ++link.readsFromPeer;
  if (links[li].counters != nullptr)
    links[li].counters->onSingleCopy(ref.bytes);
}

bool Engine::Run::readAheadFromPeer(size_t li) {
  LinkRun& lr = links[li];
  Link& link = *lr.link;
  constexpr uint32_t kReference = sizeof(format::ChunkHeader) + sizeof(format::PeerMemoryRef);
  const size_t end = std::min(lr.queues->recvs.size(), lr.processed + link.layout().slots);
  bool progress = false;
  for (size_t i = lr.processed; i < end; ++i) {
    const size_t slot = link.slotOf(lr.recvBase + i);
    if (link.arrivedBytes[slot] != kReference)
      continue;
    uint8_t* base = link.slot(slot);
    format::ChunkHeader h;
    memcpy(&h, base, sizeof(h));
    // What fits the slot is all this needs; processRecvs validates the chunk as it does any.
    if ((h.flags & format::kChunkFlagPeerMemory) == 0 || h.magic != format::kChunkMagic ||
        h.metaBytes != 0 || h.payloadBytes > link.layout().slotBytes() - sizeof(h)) {
      continue;
    }
    readFromPeer(li, base, h, base + sizeof(h));
    // Now an ordinary raw chunk in its slot.
    h.flags = 0;
    memcpy(base, &h, sizeof(h));
    link.arrivedBytes[slot] = sizeof(h) + h.payloadBytes;
    progress = true;
  }
  return progress;
}

bool Engine::Run::acknowledgeReads(size_t li) {
  Link& link = *links[li].link;
  if (link.readsAcknowledged == link.readsFromPeer)
    return false;
  if (link.abortReceived) {  // a peer that aborted waits for nothing
    link.readsAcknowledged = link.readsFromPeer;
    return false;
  }
  const uint32_t count = static_cast<uint32_t>(link.readsFromPeer) & kReadAckMask;
  PostResult r = link.connection().postWrite({}, link.peerSlots, 0,
                                             makeImm(ImmTag::kControl, kReadAckBit | count),
                                             workId(WorkKind::kControl, li, 0));
  if (r == PostResult::kError)
    connectionFailed(li);
  if (r != PostResult::kOk)
    return false;
  link.readsAcknowledged = link.readsFromPeer;
  return true;
}

// Releases processed chunks, in order (a forwarded one once its forward left).
bool Engine::Run::releaseSlots(size_t li) {
  LinkRun& lr = links[li];
  Link& link = *lr.link;
  bool progress = false;
  while (lr.releasedHere < lr.processed) {
    const RecvOp& op = lr.queues->recvs[lr.releasedHere];
    if (op.forwardsDone < op.forwarded)
      break;
    link.slotInUse[link.slotOf(lr.recvBase + lr.releasedHere)] = 0;
    ++lr.releasedHere;
    ++link.released;
    progress = true;
  }
  return progress;
}

// Releases what it can and tells the peer with one cumulative credit message: once half the
// slots are free again, or (flush) whenever this rank runs out of other work. Credits are never
// needed to finish the current collective once this rank has all its chunks, so a small
// collective ends without the extra message; the next one returns them at its first idle moment.
bool Engine::Run::returnCredits(size_t li, bool flush, bool lastRound) {
  Link& link = *links[li].link;
  bool progress = releaseSlots(li);
  if (link.abortReceived) {  // a peer that aborted sends nothing more: no credits for it
    link.creditAdvertised = link.released;
    return progress;
  }
  const uint64_t pending = link.released - link.creditAdvertised;
  const uint64_t batch = std::max<uint64_t>(1, link.layout().slots / 2);
  // In a run's last round a batch that just filled waits for the next run on this link, which
  // sends it with its own first posts (tcp: in the same write as its data). Written alone at
  // the end of a call it cost a small tcp call a sendmsg (4-5 us on the reference VM) in 20-50 %
  // of calls. The peer is held back by one slot more than by a batch short of full, and never
  // waits on it for long: any run that waits for this peer's chunks advertises it at its first
  // round's end (lastRound false), and a larger backlog goes at once.
  const uint64_t due = lastRound ? batch + 1 : batch;
  if (pending >= due || (flush && pending > 0)) {
    PostResult r = link.connection().postWrite(
        {}, link.peerSlots, 0, makeImm(ImmTag::kCredit, static_cast<uint32_t>(link.released)),
        workId(WorkKind::kCredit, li, 0));
    if (r == PostResult::kError)
      connectionFailed(li);
    if (r == PostResult::kOk) {
      link.creditAdvertised = link.released;
      progress = true;
    }
  }
  return progress;
}

}  // namespace gs::stream
