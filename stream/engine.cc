#include "stream/engine.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "codecs/chunk_header.h"
#include "codecs/reduce.h"
#include "common/error.h"
#include "common/log.h"
#include "stream/plan.h"

namespace gs::stream {
namespace {

using transport::Completion;
using transport::CompletionKind;
using transport::PostResult;

// WorkId layout: kind in the top byte, link index, op index.
enum class WorkKind : uint64_t { kData = 1, kCredit = 2, kAbort = 3, kControl = 4 };
constexpr transport::WorkId workId(WorkKind kind, size_t link, size_t index) {
  return (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(link) << 40) | index;
}
constexpr WorkKind workKind(transport::WorkId id) {
  return static_cast<WorkKind>(id >> 56);
}
constexpr size_t workLink(transport::WorkId id) {
  return (id >> 40) & 0xffff;
}
constexpr size_t workIndex(transport::WorkId id) {
  return id & ((uint64_t{1} << 40) - 1);
}

uint64_t nowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

}  // namespace

// Execution state of one collective.
struct Engine::Run {
  struct LinkRun {
    Link* link = nullptr;
    Plan::LinkQueues* queues = nullptr;
    monitoring::LinkCounters* counters = nullptr;  // may be null
    const codecs::Codec* codec = nullptr;          // codec of the chunks this rank encodes here
    uint64_t creditBlockedSinceNs = 0;             // a ready chunk waits for a credit since
    uint64_t logicalBytesSent = 0;                 // this collective
    uint64_t sendBase = 0, recvBase = 0;  // link sequences of this collective's first chunks
    size_t posted = 0, completed = 0, processed = 0, releasedHere = 0;
    std::vector<uint8_t> sendDone;
    bool answered = false;  // a kPong came back since the last liveness check was sent
  };

  Engine& engine;
  const CollectiveArgs& args;
  Plan& plan;
  std::vector<LinkRun>& links;
  size_t elementSize;
  uint32_t collectiveId;
  std::array<Completion, 64>& completions;  // scratch, the engine's (no per-call clearing)

  // Fixed codec (null: raw) or per link (CollectiveArgs::adaptive).
  const codecs::Codec* codecOn(size_t li) const { return links[li].codec; }

  Run(Engine& e, const CollectiveArgs& a, uint32_t id, Plan& p, std::vector<LinkRun>& l)
      : engine(e),
        args(a),
        plan(p),
        links(l),
        elementSize(elementSize_(a.dtype)),
        collectiveId(id),
        completions(e.completions_) {}
  static size_t elementSize_(DataType t) { return gs::elementSize(t); }

  // This rank found the failure: it is the detector, blamedRank the rank at fault.
  [[noreturn]] void fail(Errc code, int blamedRank, const std::string& cause) {
    raise(FailureNotice{code, blamedRank, engine.rank_, cause}, -1);
  }
  // Passes the notice on (unchanged: every rank reports the same cause) and throws this rank's
  // error for it. passedOnBy: the peer it came from (-1: found here).
  [[noreturn]] void raise(const FailureNotice& notice, int passedOnBy) {
    engine.notifyPeers(notice);
    throw Error(notice.code,
                formatString("%s #%u on rank %d: %s", collectiveName(args.kind), collectiveId,
                             engine.rank_, engine.describe(notice, passedOnBy).c_str()));
  }
  // The notice behind an abort message from `link`: the cause it carries, or (a write without
  // one, or one that does not decode) just the rank it names.
  FailureNotice noticeFrom(Link& link, const Completion& c) const {
    const int origin = static_cast<int>(c.imm & kImmPayloadMask);
    if (c.length > 0) {
      if (auto n = decodeNotice(link.notice(), std::min<size_t>(c.length, SlotLayout::kNoticeBytes),
                                engine.nranks_)) {
        return *n;
      }
    }
    return FailureNotice{Errc::kRemote, origin, link.peer(), formatString("rank %d failed", origin)};
  }

  // A well-formed chunk of a call that differs from this rank's (the user called different
  // collectives, counts, ops or dtypes on different ranks): the cause, naming both ranks and
  // both values, as every rank will report it; "" when the chunk is not of that kind. The
  // header is untrusted: the name functions answer "unknown" for values out of range.
  std::string callMismatch(const codecs::ChunkHeader& h, int peer) const {
    if (h.magic != codecs::kChunkMagic || h.version != codecs::kChunkVersion)
      return "";
    const int me = engine.rank_;
    if (h.collective != static_cast<uint8_t>(args.kind)) {
      return formatString("collective differs between ranks: rank %d called %s, rank %d %s", peer,
                          collectiveName(static_cast<CollectiveKind>(h.collective)), me,
                          collectiveName(args.kind));
    }
    if (h.totalCount != args.count) {
      return formatString("count differs between ranks: rank %d called with %llu, rank %d with %zu",
                          peer, static_cast<unsigned long long>(h.totalCount), me, args.count);
    }
    if (h.reduceOp != static_cast<uint8_t>(args.op)) {
      return formatString("reduction op differs between ranks: rank %d called with %s, rank %d "
                          "with %s",
                          peer, reduceOpName(static_cast<ReduceOp>(h.reduceOp)), me,
                          reduceOpName(args.op));
    }
    if (h.dtype != static_cast<uint8_t>(args.dtype)) {
      return formatString("dtype differs between ranks: rank %d called with %s, rank %d with %s",
                          peer, dataTypeName(static_cast<DataType>(h.dtype)), me,
                          dataTypeName(args.dtype));
    }
    if (h.collectiveId != collectiveId) {
      return formatString("ranks are at different calls: rank %d sent collective #%u, rank %d is "
                          "at #%u (a rank skipped or added a call)",
                          peer, h.collectiveId, me, collectiveId);
    }
    return "";
  }

  bool satisfied(uint32_t begin, uint32_t end) const {
    for (uint32_t i = begin; i < end; ++i) {
      const Dependency& d = plan.deps[i];
      const LinkRun& l = links[d.link];
      if ((d.onSend ? l.completed : l.processed) < d.count)
        return false;
    }
    return true;
  }

  void fillHeader(codecs::ChunkHeader* h,
                  const SendOp& op,
                  uint64_t seq,
                  uint8_t codecId,
                  uint32_t metaBytes,
                  uint32_t payloadBytes) const {
    memset(h, 0, sizeof(*h));
    h->magic = codecs::kChunkMagic;
    h->version = codecs::kChunkVersion;
    h->codec = codecId;
    h->dtype = static_cast<uint8_t>(args.dtype);
    h->collectiveId = collectiveId;
    h->step = op.step;
    h->sequence = seq;
    h->chunkIndex = op.chunkIndex;
    h->elementCount = op.count;
    h->metaBytes = metaBytes;
    h->payloadBytes = payloadBytes;
    h->elementOffset = op.elementOffset;
    h->totalCount = args.count;
    h->collective = static_cast<uint8_t>(args.kind);
    h->reduceOp = static_cast<uint8_t>(args.op);
  }

  // Seed of stochastic rounding: the same on every run of the same chunk, different per chunk.
  uint64_t seedOf(const SendOp& op) const {
    return (static_cast<uint64_t>(collectiveId) << 40) ^
           (static_cast<uint64_t>(engine.rank_) << 24) ^ (static_cast<uint64_t>(op.step) << 32) ^
           op.chunkIndex;
  }

  bool postSends(size_t li) {
    LinkRun& lr = links[li];
    Link& link = *lr.link;
    bool progress = false;
    while (lr.posted < lr.queues->sends.size()) {
      SendOp& op = lr.queues->sends[lr.posted];
      if (!satisfied(op.depBegin, op.depEnd))
        break;
      if (!link.hasCredit()) {
        if (lr.creditBlockedSinceNs == 0)
          lr.creditBlockedSinceNs = nowNs();
        break;
      }
      const uint64_t seq = link.sendSequence;
      const size_t slot = link.slotOf(seq);
      if (link.headerBusy[slot])
        break;
      transport::LocalSegment segs[2];
      size_t nsegs = 1;
      uint32_t wireBytes = 0;
      const codecs::Codec* codec = codecOn(li);
      const bool encode = op.forwardLink < 0 && codec != nullptr && op.count > 0 && !op.raw;
      if (encode) {
        // Header, metadata and payload contiguous in this slot's staging: one segment.
        uint8_t* out = link.encodeStaging(slot);
        const uint64_t encodeStart = nowNs();
        const codecs::EncodedSize size = codec->encode(
            args.dtype, op.source, op.count, out + sizeof(codecs::ChunkHeader), seedOf(op));
        if (lr.counters != nullptr)
          lr.counters->addEncodeTime(nowNs() - encodeStart);
        fillHeader(reinterpret_cast<codecs::ChunkHeader*>(out), op, seq,
                   static_cast<uint8_t>(codec->id()), size.metaBytes, size.payloadBytes);
        wireBytes = size.metaBytes + size.payloadBytes;
        segs[0] = {&link.encodeRegion(), slot * link.layout().slotBytes(),
                   sizeof(codecs::ChunkHeader) + wireBytes};
      } else {
        auto* h = reinterpret_cast<codecs::ChunkHeader*>(link.headerStaging(slot));
        segs[0] = {&link.headerRegion(), slot * 64, sizeof(codecs::ChunkHeader)};
        if (op.forwardLink >= 0) {
          // Exactly the bytes that arrived (or were re-encoded) in the receive slot.
          LinkRun& from = links[op.forwardLink];
          const RecvOp& src = from.queues->recvs[op.forwardIndex];
          fillHeader(h, op, seq, src.slotCodec, src.slotMetaBytes, src.slotPayloadBytes);
          wireBytes = src.slotMetaBytes + src.slotPayloadBytes;
          const size_t fslot = from.link->slotOf(from.recvBase + op.forwardIndex);
          segs[1] = {&from.link->recvSlotsRegion(),
                     fslot * from.link->layout().slotBytes() + sizeof(codecs::ChunkHeader),
                     wireBytes};
        } else {
          wireBytes = static_cast<uint32_t>(op.count * elementSize);
          fillHeader(h, op, seq, static_cast<uint8_t>(codecs::CodecId::kRaw), 0, wireBytes);
          segs[1] = {op.region, op.regionOffset, wireBytes};
        }
        nsegs = wireBytes > 0 ? 2 : 1;
      }
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
        decodeOwn(reinterpret_cast<const codecs::ChunkHeader*>(enc),
                  enc + sizeof(codecs::ChunkHeader), op.count, decoded);
        if (sample)
          recordError(lr, codec->id(), op.source, decoded, op.count);
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
      ++link.sendSequence;
      ++lr.posted;
      op.postedNs = nowNs();
      lr.logicalBytesSent += op.count * elementSize;
      if (lr.counters != nullptr) {
        lr.counters->onChunkSent(
            op.count * elementSize, sizeof(codecs::ChunkHeader) + wireBytes,
            encode ? static_cast<int>(codec->id())
                   : static_cast<int>(
                         reinterpret_cast<const codecs::ChunkHeader*>(link.headerStaging(slot))
                             ->codec));
        if (lr.creditBlockedSinceNs != 0)
          lr.counters->addCreditWait(op.postedNs - lr.creditBlockedSinceNs);
      }
      lr.creditBlockedSinceNs = 0;
      engine.stats_.chunksSent++;
      engine.stats_.bytesSent += sizeof(codecs::ChunkHeader) + wireBytes;
      engine.stats_.bytesLogical += op.count * elementSize;
      progress = true;
    }
    return progress;
  }

  void onSendComplete(size_t li, size_t index) {
    LinkRun& lr = links[li];
    if (index >= lr.posted || lr.sendDone[index])
      fail(Errc::kInternal, engine.rank_, "stray send completion");
    lr.sendDone[index] = 1;
    Link& link = *lr.link;
    link.headerBusy[link.slotOf(lr.sendBase + index)] = 0;
    const SendOp& op = lr.queues->sends[index];
    if (lr.counters != nullptr)
      lr.counters->onChunkCompleted(nowNs() - op.postedNs);
    if (op.forwardLink >= 0)
      ++links[op.forwardLink].queues->recvs[op.forwardIndex].forwardsDone;
    while (lr.completed < lr.posted && lr.sendDone[lr.completed])
      ++lr.completed;
  }

  // Acts on a chunk through the decoder of its codec (raw included): fused decode + reduce into
  // place; ring hops reduce into the slot and, in a compressed collective, re-encode there.
  void applyChunk(Link& link, RecvOp& op, const codecs::ChunkHeader& h, uint8_t* payload) {
    const codecs::Codec& dec = engine.decoder(h.codec);
    const char* why = nullptr;
    switch (op.action) {
      case RecvAction::kCopy:
        why = dec.decode(args.dtype, payload, h.metaBytes, h.payloadBytes, op.count, op.dst);
        break;
      case RecvAction::kReduce:
        why = dec.decodeReduce(args.dtype, args.op, payload, h.metaBytes, h.payloadBytes, op.count,
                               op.dst, op.dst, false);
        break;
      case RecvAction::kReduceWith:
        why = dec.decodeReduce(args.dtype, args.op, payload, h.metaBytes, h.payloadBytes, op.count,
                               op.operand, op.dst, op.incomingFirst);
        break;
      case RecvAction::kReduceToSlot: {
        // The sum leaves encoded with the codec of the link that forwards it; raw steps (and raw
        // collectives) forward it raw.
        const codecs::Codec* out =
            op.raw
                ? nullptr
                : (op.forwardedOn >= 0 ? codecOn(static_cast<size_t>(op.forwardedOn)) : args.codec);
        if (out == nullptr && h.codec == static_cast<uint8_t>(codecs::CodecId::kRaw)) {
          // Raw in, raw out: reduce in the slot itself (decodeReduce allows dst == its input).
          why = dec.decodeReduce(args.dtype, args.op, payload, h.metaBytes, h.payloadBytes,
                                 op.count, op.operand, payload, false);
          break;
        }
        uint8_t* scratch = engine.scratch(0);
        why = dec.decodeReduce(args.dtype, args.op, payload, h.metaBytes, h.payloadBytes, op.count,
                               op.operand, scratch, false);
        if (why == nullptr) {
          if (out == nullptr) {
            // Raw collective (or raw step) receiving a compressed chunk: forward the sum raw.
            memcpy(payload, scratch, op.count * elementSize);
            op.slotCodec = static_cast<uint8_t>(codecs::CodecId::kRaw);
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
                        codecs::codecIdName(static_cast<codecs::CodecId>(h.codec)), link.peer(),
                        op.step, op.chunkIndex, why));
    }
  }

  // Encodes a reduced chunk back into its slot for forwarding (the slot holds up to
  // maxEncodedBytes after the header, see SlotLayout).
  void reencode(RecvOp& op,
                const codecs::Codec& codec,
                const uint8_t* values,
                uint8_t* slotPayload) {
    const uint64_t encodeStart = nowNs();
    const codecs::EncodedSize size =
        codec.encode(args.dtype, values, op.count, slotPayload,
                     seedOf(SendOp{op.step, op.chunkIndex, op.elementOffset, op.count}));
    LinkRun& out = links[static_cast<size_t>(std::max(op.forwardedOn, 0))];
    if (out.counters != nullptr)
      out.counters->addEncodeTime(nowNs() - encodeStart);
    op.slotCodec = static_cast<uint8_t>(codec.id());
    op.slotMetaBytes = size.metaBytes;
    op.slotPayloadBytes = size.payloadBytes;
    const bool sample = sampleError(codec);
    if (args.residual != nullptr || sample) {
      codecs::ChunkHeader h{};
      h.codec = op.slotCodec;
      h.metaBytes = size.metaBytes;
      h.payloadBytes = size.payloadBytes;
      uint8_t* decoded = engine.scratch(1);
      decodeOwn(&h, slotPayload, op.count, decoded);
      if (sample)
        recordError(out, codec.id(), values, decoded, op.count);
      // The values belong to the block of op.operand (this rank's contribution to it).
      if (args.residual != nullptr)
        codecs::updateResidual(args.dtype, values, decoded, residualAt(op.operand), op.count);
    }
  }

  // Decodes a chunk this rank encoded itself (cannot fail unless the codec is broken).
  void decodeOwn(const codecs::ChunkHeader* h,
                 const uint8_t* encoded,
                 uint32_t count,
                 uint8_t* out) {
    if (const char* why = engine.decoder(h->codec).decode(args.dtype, encoded, h->metaBytes,
                                                          h->payloadBytes, count, out))
      fail(Errc::kInternal, engine.rank_, formatString("own chunk does not decode: %s", why));
  }

  // Numerics guardrail: every errorSampleEvery_-th lossy chunk is decoded back and compared.
  bool sampleError(const codecs::Codec& codec) const {
    if (codec.id() == codecs::CodecId::kRaw || engine.errorSampleEvery_ == 0)
      return false;
    return engine.lossyChunks_++ % engine.errorSampleEvery_ == 0;
  }
  void recordError(LinkRun& lr,
                   codecs::CodecId id,
                   const void* values,
                   const void* decoded,
                   uint32_t count) const {
    if (lr.counters != nullptr) {
      lr.counters->onErrorSample(static_cast<int>(id),
                                 codecs::relativeError(args.dtype, values, decoded, count));
    }
  }

  void scaleResidual(void* residual, size_t count, double factor) const {
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
  void* residualAt(const void* element) const {
    const auto* e = static_cast<const uint8_t*>(element);
    const auto* recv = static_cast<const uint8_t*>(args.recv);
    const auto* base = e >= recv && e < recv + args.count * elementSize
                           ? recv
                           : static_cast<const uint8_t*>(args.send);
    const size_t index = static_cast<size_t>(e - base) / elementSize;
    return static_cast<uint8_t*>(args.residual) + index * codecs::residualElementSize(args.dtype);
  }

  bool processRecvs(size_t li) {
    LinkRun& lr = links[li];
    Link& link = *lr.link;
    bool progress = false;
    while (lr.processed < lr.queues->recvs.size()) {
      RecvOp& op = lr.queues->recvs[lr.processed];
      const uint64_t seq = lr.recvBase + lr.processed;
      const size_t slot = link.slotOf(seq);
      const uint32_t arrived = link.arrivedBytes[slot];
      if (arrived == Link::kNotArrived || !satisfied(op.depBegin, op.depEnd))
        break;
      uint8_t* base = link.slot(slot);
      codecs::ChunkHeader h;
      memcpy(&h, base, sizeof(h));
      codecs::ChunkExpectation e{collectiveId,
                                 op.step,
                                 static_cast<uint8_t>(args.dtype),
                                 seq,
                                 op.chunkIndex,
                                 op.count,
                                 op.elementOffset,
                                 args.count,
                                 static_cast<uint8_t>(args.kind),
                                 static_cast<uint8_t>(args.op),
                                 elementSize};
      if (const char* why = codecs::validateChunk(h, e, arrived)) {
        const std::string mismatch = callMismatch(h, link.peer());
        if (!mismatch.empty())
          fail(Errc::kInvalidArgument, link.peer(), mismatch);
        fail(Errc::kRemote, link.peer(),
             formatString("invalid chunk from rank %d (step %u, chunk %u): %s (received count %llu "
                          "elements %u, expected count %zu elements %u)",
                          link.peer(), op.step, op.chunkIndex, why,
                          static_cast<unsigned long long>(h.totalCount), h.elementCount, args.count,
                          op.count));
      }
      uint8_t* payload = base + sizeof(codecs::ChunkHeader);
      op.slotCodec = h.codec;
      op.slotMetaBytes = h.metaBytes;
      op.slotPayloadBytes = h.payloadBytes;
      applyChunk(link, op, h, payload);
      if (op.finalize)
        codecs::finalizeAverage(args.dtype, args.op, op.dst, op.count, engine.nranks_);
      link.arrivedBytes[slot] = Link::kNotArrived;
      op.processed = true;
      ++lr.processed;
      engine.stats_.chunksReceived++;
      progress = true;
    }
    return progress;
  }

  // Releases processed chunks (in order; a forwarded one once its forward left) and tells the
  // peer with one cumulative credit message: once half the slots are free again, or (flush)
  // whenever this rank runs out of other work. Credits are never needed to finish the current
  // collective once this rank has all its chunks, so a small collective ends without the extra
  // message; the next one returns them at its first idle moment.
  bool returnCredits(size_t li, bool flush) {
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
    const uint64_t pending = link.released - link.creditAdvertised;
    const uint64_t batch = std::max<uint64_t>(1, link.layout().slots / 2);
    if (pending >= batch || (flush && pending > 0)) {
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

  [[noreturn]] void connectionFailed(size_t li) {
    Link& link = *links[li].link;
    std::string why = link.connection().errorMessage();
    // A neighbour that closed may only have been passing on another rank's failure, and the
    // notice naming that rank may come over another link: listen briefly before blaming it.
    FailureNotice notice;
    int reporter = -1;
    if (findAbortNotice(li, Deadline::after(std::chrono::milliseconds(200)), &notice, &reporter))
      raise(notice, reporter);
    // The transport's message names the peer already ("connection to rank 2 (...) reset by
    // peer", "peer rank 2 (pid ...) exited").
    fail(Errc::kRemote, link.peer(),
         why.empty() ? formatString("connection to rank %d failed", link.peer()) : why);
  }

  // Polls the links other than `failed` for an abort notice until the deadline (the collective
  // is failing: other completions are dropped).
  bool findAbortNotice(size_t failed, Deadline deadline, FailureNotice* notice, int* reporter) {
    std::array<Completion, 16> sink;
    bool any = false;
    for (size_t li = 0; li < links.size(); ++li)
      any |= li != failed && links[li].link != links[failed].link;
    if (!any)
      return false;
    while (!deadline.expired()) {
      for (size_t li = 0; li < links.size(); ++li) {
        Link& other = *links[li].link;
        if (li == failed || &other == links[failed].link)
          continue;
        const size_t n = other.connection().poll(sink);
        for (size_t k = 0; k < n; ++k) {
          if (sink[k].kind == CompletionKind::kRemoteWrite &&
              immTag(sink[k].imm) == ImmTag::kAbort) {
            other.abortReceived = true;
            *notice = noticeFrom(other, sink[k]);
            *reporter = other.peer();
            return true;
          }
        }
      }
      engine.waitForActivity(std::chrono::microseconds(2000));
    }
    return false;
  }

  bool pollLink(size_t li) {
    Link& link = *links[li].link;
    bool progress = false;
    if (!link.earlyCompletions.empty()) {
      // Arrived while the link was being set up (see Link::earlyCompletions).
      std::vector<Completion> early;
      early.swap(link.earlyCompletions);
      for (const Completion& c : early)
        onCompletion(li, c);
      progress = true;
    }
    for (;;) {
      const size_t n = link.connection().poll(completions);
      for (size_t i = 0; i < n; ++i) {
        onCompletion(li, completions[i]);
        progress |= !isLivenessCheck(completions[i]);
      }
      if (n < completions.size())
        break;
    }
    return progress;
  }

  // Pings, pongs and their send completions say a peer is alive, not that the collective moves:
  // they must not reset the timeout they are part of.
  static bool isLivenessCheck(const Completion& c) {
    if (c.kind == CompletionKind::kWrite)
      return c.status == Errc::kOk && workKind(c.id) == WorkKind::kControl;
    return c.kind == CompletionKind::kRemoteWrite &&
           (isControl(c.imm, ControlCode::kPing) || isControl(c.imm, ControlCode::kPong));
  }

  void onCompletion(size_t li, const Completion& c) {
    switch (c.kind) {
      case CompletionKind::kError:
        connectionFailed(li);
      case CompletionKind::kWrite:
        if (c.status != Errc::kOk)
          connectionFailed(li);
        if (workKind(c.id) == WorkKind::kData)
          onSendComplete(workLink(c.id), workIndex(c.id));
        break;
      case CompletionKind::kRemoteWrite:
        onRemoteWrite(li, c);
        break;
      case CompletionKind::kSend:
      case CompletionKind::kRecv:
        break;  // not used by the chunk protocol
    }
  }

  void onRemoteWrite(size_t li, const Completion& c) {
    Link& link = *links[li].link;
    const uint32_t payload = c.imm & kImmPayloadMask;
    switch (immTag(c.imm)) {
      case ImmTag::kData:
        // A peer that ignores credits must not overwrite a slot still being reduced or
        // forwarded.
        if (payload >= link.layout().slots || link.slotInUse[payload]) {
          fail(Errc::kRemote, link.peer(),
               formatString("rank %d wrote into slot %u, which is not free", link.peer(), payload));
        }
        link.arrivedBytes[payload] = c.length;
        link.slotInUse[payload] = 1;
        if (links[li].counters != nullptr)
          links[li].counters->onChunkReceived(c.length);
        break;
      case ImmTag::kCredit:
        GS_LOG_TRACE("credit from rank %d: %u (had %llu)", link.peer(), payload,
                     static_cast<unsigned long long>(link.peerReleased));
        link.applyCredit(payload);
        if (links[li].counters != nullptr)
          links[li].counters->touch();
        break;
      case ImmTag::kControl:
        onControl(li, static_cast<ControlCode>(payload));
        break;
      case ImmTag::kAbort:
        link.abortReceived = true;
        raise(noticeFrom(link, c), link.peer());
      default:
        fail(Errc::kRemote, link.peer(),
             formatString("rank %d sent an unknown message", link.peer()));
    }
  }

  bool done() const {
    for (const LinkRun& l : links) {
      if (l.completed < l.queues->sends.size() || l.releasedHere < l.queues->recvs.size()) {
        return false;
      }
    }
    return true;
  }

  // What the collective is waiting for, for the timeout message.
  std::string waitingFor() const {
    for (const LinkRun& l : links) {
      if (l.processed < l.queues->recvs.size()) {
        const RecvOp& op = l.queues->recvs[l.processed];
        return formatString("waiting for chunk %u of step %u from rank %d", op.chunkIndex, op.step,
                            l.link->peer());
      }
    }
    for (const LinkRun& l : links) {
      if (l.posted < l.queues->sends.size() || l.completed < l.posted) {
        return formatString("waiting to send to rank %d (credits from it: %llu of %llu chunks)",
                            l.link->peer(), static_cast<unsigned long long>(l.link->peerReleased),
                            static_cast<unsigned long long>(l.link->sendSequence));
      }
    }
    return "waiting to return credits";
  }

  // The link this rank waits on: the first with a chunk still to come, else the first still
  // waiting for credits, else the first.
  size_t blockingLink() const {
    for (size_t li = 0; li < links.size(); ++li) {
      if (links[li].processed < links[li].queues->recvs.size())
        return li;
    }
    for (size_t li = 0; li < links.size(); ++li) {
      if (links[li].completed < links[li].queues->sends.size())
        return li;
    }
    return 0;
  }

  void onControl(size_t li, ControlCode code) {
    Link& link = *links[li].link;
    switch (code) {
      case ControlCode::kBye:
        link.byeReceived = true;
        return;
      case ControlCode::kPing:
        // Best effort: a full queue only makes the asking rank wait for its grace.
        (void)link.connection().postWrite({}, link.peerSlots, 0,
                                          makeControl(ControlCode::kPong),
                                          workId(WorkKind::kControl, 0, 0));
        return;
      case ControlCode::kPong:
        links[li].answered = true;
        return;
    }
    fail(Errc::kRemote, link.peer(),
         formatString("rank %d sent an unknown control message", link.peer()));
  }

  // No progress for the timeout: who is at fault? The rank this one waits for may only be
  // waiting itself (in a ring, rank 3 waits for rank 2, which waits for the stopped rank 1), so
  // it is asked first (kPing; any rank running a collective answers at once). No answer within
  // the grace: it is the one that stopped, and this rank says so to everyone. An answer: it is
  // alive, and the rank waiting for the stopped one will name it (its notice comes here); only
  // if none does within another two graces does this rank give up on its own.
  struct LivenessCheck {
    bool asked = false;
    size_t link = 0;
    Clock::time_point at{};
    std::string waiting;  // what this rank was waiting for when it asked
  };
  LivenessCheck check;

  void onNoProgress(Clock::time_point now) {
    const auto grace = engine.livenessGrace();
    if (!check.asked) {
      check = LivenessCheck{true, blockingLink(), now, waitingFor()};
      Link& link = *links[check.link].link;
      links[check.link].answered = false;
      (void)link.connection().postWrite({}, link.peerSlots, 0, makeControl(ControlCode::kPing),
                                        workId(WorkKind::kControl, 0, 0));
      return;
    }
    const int suspect = links[check.link].link->peer();
    const long long timeoutMs = static_cast<long long>(engine.config_.timeoutMs);
    const long long graceMs = static_cast<long long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(grace).count());
    if (!links[check.link].answered) {
      if (now - check.at < grace)
        return;
      fail(Errc::kTimeout, suspect,
           formatString("rank %d stopped making progress: rank %d got nothing from it for %lld ms "
                        "(%s) and no answer to a liveness check within %lld ms (stopped, hung or "
                        "starved of CPU?)",
                        suspect, engine.rank_, timeoutMs, check.waiting.c_str(), graceMs));
    }
    if (now - check.at < 3 * grace)
      return;
    fail(Errc::kTimeout, suspect,
         formatString("no progress for %lld ms (%s); rank %d answers a liveness check but made "
                      "no progress either, and no rank named a cause within %lld ms",
                      timeoutMs, check.waiting.c_str(), suspect, 3 * graceMs));
  }

  void execute() {
    auto lastProgress = Clock::now();
    const auto timeout = std::chrono::milliseconds(engine.config_.timeoutMs);
    int idle = 0;
    for (;;) {
      bool progress = false;
      for (size_t li = 0; li < links.size(); ++li)
        progress |= pollLink(li);
      for (size_t li = 0; li < links.size(); ++li) {
        progress |= processRecvs(li);
        progress |= returnCredits(li, false);
        progress |= postSends(li);
      }
      if (!progress) {
        for (size_t li = 0; li < links.size(); ++li)
          progress |= returnCredits(li, true);
      }
      if (done())
        return;
      if (engine.abortFlag_.load(std::memory_order_relaxed))
        fail(Errc::kAborted, engine.rank_, "communicator aborted");
      const auto now = Clock::now();
      if (progress) {
        lastProgress = now;
        idle = 0;
        check.asked = false;
        continue;
      }
      if (now - lastProgress > timeout)
        onNoProgress(now);
      if (++idle > engine.spinRounds_ && now - lastProgress >= engine.spinTime_) {
        // Past the timeout (a liveness check is out) in 1 ms steps.
        auto left =
            std::chrono::duration_cast<std::chrono::microseconds>(timeout - (now - lastProgress));
        engine.waitForActivity(std::clamp(left, std::chrono::microseconds(1000),
                                          std::chrono::microseconds(2000)));
      }
    }
  }
};

Engine::Engine(int rank,
               int nranks,
               transport::Device& device,
               std::vector<Link*> linksByPeer,
               const Config& config,
               const std::atomic<bool>& abortFlag)
    : rank_(rank),
      nranks_(nranks),
      device_(device),
      links_(std::move(linksByPeer)),
      config_(config),
      abortFlag_(abortFlag),
      topology_(Topology::blocks(nranks, nranks)),
      chunkBytes_(config.chunkBytes) {
  // Only devices that serve a link are waited on (a device with no connection would only eat
  // its slice of every wait); the primary one alone when there is no link at all.
  for (Link* link : links_) {
    if (link != nullptr &&
        std::find(devices_.begin(), devices_.end(), &link->device()) == devices_.end())
      devices_.push_back(&link->device());
  }
  if (devices_.empty())
    devices_.push_back(&device_);
  for (transport::Device* d : devices_)
    registrationPinsMemory_ |= d->properties().registrationPinsMemory;
  for (int id = 0; id < codecs::kNumCodecIds; ++id) {
    codecs::CodecSpec spec;
    spec.id = static_cast<codecs::CodecId>(id);
    decoders_[id] = codecs::makeCodec(spec);
  }
}

Engine::~Engine() = default;

void Engine::setChunkBytes(int64_t bytes) {
  GS_CHECK(bytes >= 4096 && bytes <= config_.chunkBytes, Errc::kInvalidArgument,
           "chunk size %lld outside [4096, %lld] (the receive slots hold one chunk)",
           static_cast<long long>(bytes), static_cast<long long>(config_.chunkBytes));
  chunkBytes_ = bytes;
}

void Engine::setLinkCodec(int peer, const codecs::Codec* codec) {
  if (peer < 0)
    return;
  if (static_cast<size_t>(peer) >= linkCodecs_.size())
    linkCodecs_.resize(static_cast<size_t>(peer) + 1, nullptr);
  linkCodecs_[peer] = codec;
}

struct Engine::Prepared {
  CollectiveArgs key;
  Schedule schedule;
  std::unique_ptr<transport::MemoryRegion> sendRegion, recvRegion;
  std::vector<std::unique_ptr<transport::MemoryRegion>> otherRegions;  // see registerOnLinkDevices
  Plan plan;
  std::vector<Run::LinkRun> links;
  uint64_t lastUse = 0;
  const char* algorithm = "ring";
  int64_t chunkBytes = 0;  // chunk size the plan was cut with
  bool adaptive = false;

  bool matches(const CollectiveArgs& a) const {
    return a.kind == key.kind && a.send == key.send && a.recv == key.recv && a.count == key.count &&
           a.dtype == key.dtype && a.op == key.op && a.root == key.root && a.codec == key.codec &&
           a.adaptive == key.adaptive && a.algorithm == key.algorithm;
  }
};

namespace {
constexpr size_t kPreparedCapacity = 16;
}  // namespace

Engine::Prepared& Engine::prepare(const CollectiveArgs& args) {
  for (auto& p : prepared_) {
    if (p->matches(args) && p->chunkBytes == chunkBytes_) {
      p->lastUse = ++useClock_;
      return *p;
    }
  }
  auto p = std::make_unique<Prepared>();
  p->key = args;
  p->chunkBytes = chunkBytes_;
  const size_t esize = elementSize(args.dtype);
  // One round of messages beats the ring's two while latency, not bandwidth, dominates.
  // (Raw only: with a lossy codec each rank would reduce its own exact value with the peer's
  // decoded one, and replicas would differ.)
  const bool latencyBound = args.codec == nullptr && args.count * esize <= kExchangeMaxBytes;
  // codec=auto leaves latency-bound collectives raw (their round trip, not bytes, is the cost).
  p->adaptive = args.adaptive && args.codec == nullptr && !latencyBound;
  if (args.kind == CollectiveKind::kAllReduce) {
    GS_CHECK(args.residual == nullptr || args.algorithm == Algorithm::kRing, Errc::kInvalidArgument,
             "error feedback needs the ring allreduce, not %s", algorithmName(args.algorithm));
    p->schedule = buildAllReduce(args.algorithm, rank_, topology_, args.count, latencyBound);
    p->algorithm = args.algorithm == Algorithm::kRing && latencyBound && nranks_ == 2
                       ? "exchange"
                       : algorithmName(args.algorithm);
  } else {
    p->schedule = buildSchedule(args.kind, rank_, nranks_, args.root, args.count, latencyBound);
    p->algorithm = args.kind == CollectiveKind::kBroadcast ? "chain" : "ring";
  }
  const auto* send = static_cast<const uint8_t*>(args.send);
  auto* recv = static_cast<uint8_t*>(args.recv);
  if (!p->schedule.steps.empty()) {
    // Registration is cheap for tcp and loopback (a bounds record); verbs pins the pages, so
    // run() drops these regions when the call ends (registrationPinsMemory_).
    if (p->schedule.sendCount > 0) {
      p->sendRegion =
          device_.registerMemory(const_cast<uint8_t*>(send), p->schedule.sendCount * esize);
    }
    if (p->schedule.recvCount > 0) {
      p->recvRegion = device_.registerMemory(recv, p->schedule.recvCount * esize);
    }
    const size_t chunkElements = std::max<size_t>(1, static_cast<size_t>(chunkBytes_) / esize);
    p->plan = buildPlan({&p->schedule, send, recv, p->sendRegion.get(), p->recvRegion.get(), esize,
                         chunkElements,
                         std::max<size_t>(1, static_cast<size_t>(config_.slotsPerPeer) / 2)});
    for (auto& q : p->plan.links) {
      Link* link = q.peer >= 0 && q.peer < nranks_ ? links_[q.peer] : nullptr;
      GS_CHECK(link != nullptr && link->connected(), Errc::kInternal,
               "no connection to rank %d for %s", q.peer, collectiveName(args.kind));
      if (args.codec != nullptr || p->adaptive)
        link->ensureEncodeStaging();
      Run::LinkRun lr;
      lr.link = link;
      lr.queues = &q;
      lr.sendDone.assign(q.sends.size(), 0);
      if (static_cast<size_t>(q.peer) < counters_.size())
        lr.counters = counters_[q.peer];
      p->links.push_back(std::move(lr));
    }
    registerOnLinkDevices(*p);
  }
  p->lastUse = ++useClock_;
  if (prepared_.size() >= kPreparedCapacity) {
    auto oldest =
        std::min_element(prepared_.begin(), prepared_.end(),
                         [](const auto& a, const auto& b) { return a->lastUse < b->lastUse; });
    *oldest = std::move(p);
    return **oldest;
  }
  prepared_.push_back(std::move(p));
  return *prepared_.back();
}

void Engine::run(const CollectiveArgs& args) {
  const uint32_t id = collectiveId_++;
  stats_ = {};
  Prepared& p = prepare(args);
  // A device that pins registered pages (verbs) must not keep registrations of the caller's
  // buffers beyond this call: freed and reallocated memory at the same address would be other
  // pages. Plans for such devices are rebuilt per call.
  struct ForgetIfPinned {
    Engine& engine;
    const Prepared* prepared;
    ~ForgetIfPinned() {
      if (engine.registrationPinsMemory_)
        std::erase_if(engine.prepared_, [&](const auto& q) { return q.get() == prepared; });
    }
  } forget{*this, &p};
  lastAlgorithm_ = p.algorithm;
  const size_t esize = elementSize(args.dtype);
  const auto* send = static_cast<const uint8_t*>(args.send);
  auto* recv = static_cast<uint8_t*>(args.recv);
  for (const auto& [src, dst] : p.schedule.localCopies) {
    const uint8_t* from = (src.buffer == BufferId::kSend ? send : recv) + src.offset * esize;
    uint8_t* to =
        (dst.buffer == BufferId::kSend ? const_cast<uint8_t*>(send) : recv) + dst.offset * esize;
    if (from != to && src.count > 0)
      memmove(to, from, src.count * esize);
  }
  if (p.schedule.steps.empty())
    return;

  for (auto& lr : p.links) {
    lr.sendBase = lr.link->sendSequence;
    lr.recvBase = lr.link->recvSequence;
    lr.posted = lr.completed = lr.processed = lr.releasedHere = 0;
    lr.creditBlockedSinceNs = lr.logicalBytesSent = 0;
    const int peer = lr.link->peer();
    lr.codec = p.adaptive && static_cast<size_t>(peer) < linkCodecs_.size() ? linkCodecs_[peer]
                                                                            : args.codec;
    std::fill(lr.sendDone.begin(), lr.sendDone.end(), 0);
    for (RecvOp& op : lr.queues->recvs) {
      op.processed = false;
      op.forwardsDone = 0;
    }
  }
  stats_.adaptive = p.adaptive;
  Run run(*this, args, id, p.plan, p.links);
  const uint64_t startNs = nowNs();
  run.execute();
  const uint64_t endNs = nowNs();
  constexpr uint64_t kGoodputPeriodNs = 100'000'000;
  for (auto& lr : p.links) {
    Link& link = *lr.link;
    link.goodputBytes += lr.logicalBytesSent;
    link.goodputBusyNs += endNs - startNs;
    if (lr.counters != nullptr)
      lr.counters->addBusyTime(endNs - startNs);
    if (lr.counters != nullptr && endNs - link.goodputPublishedNs >= kGoodputPeriodNs &&
        link.goodputBusyNs > 0) {
      lr.counters->setGoodput(static_cast<double>(link.goodputBytes) * 1e9 /
                              static_cast<double>(link.goodputBusyNs));
      link.goodputBytes = link.goodputBusyNs = 0;
      link.goodputPublishedNs = endNs;
    }
  }
  for (auto& lr : p.links)
    lr.link->recvSequence += lr.queues->recvs.size();
}

// Links served by another device than the primary one (shm peers next to tcp ones) send from
// the user's buffers registered with their own device.
void Engine::registerOnLinkDevices(Prepared& p) {
  for (transport::Device* device : devices_) {
    if (device == &device_)
      continue;
    std::unique_ptr<transport::MemoryRegion> send, recv;
    for (auto& lr : p.links) {
      if (&lr.link->device() != device)
        continue;
      if (!send && p.sendRegion)
        send = device->registerMemory(p.sendRegion->data(), p.sendRegion->size());
      if (!recv && p.recvRegion)
        recv = device->registerMemory(p.recvRegion->data(), p.recvRegion->size());
      for (SendOp& op : lr.queues->sends) {
        if (op.region == p.sendRegion.get())
          op.region = send.get();
        else if (op.region == p.recvRegion.get())
          op.region = recv.get();
      }
    }
    if (send)
      p.otherRegions.push_back(std::move(send));
    if (recv)
      p.otherRegions.push_back(std::move(recv));
  }
}

void Engine::waitForActivity(std::chrono::microseconds maxWait) {
  if (devices_.size() == 1) {
    devices_.front()->waitForActivity(maxWait);
    return;
  }
  // Several devices: none can wake a wait on another, so each waits a short slice in turn.
  const auto slice =
      std::min(maxWait / static_cast<int>(devices_.size()), std::chrono::microseconds(50));
  for (transport::Device* device : devices_)
    device->waitForActivity(slice);
}

void Engine::notifyPeers(Errc code, const std::string& cause) noexcept {
  try {
    notifyPeers(FailureNotice{code, rank_, rank_, cause});
  } catch (...) {
    // The cause's copy ran out of memory: the peers learn by timeout.
  }
}

std::string Engine::describe(const FailureNotice& n, int passedOnBy) const {
  if (n.detector == rank_)
    return n.cause;
  // A call mismatch (kInvalidArgument) names both ranks in its cause: neither is "at fault".
  if (n.origin == rank_ && n.code != Errc::kInvalidArgument) {
    return formatString("rank %d reported this rank at fault: %s", n.detector, n.cause.c_str());
  }
  if (passedOnBy < 0 || passedOnBy == n.detector)
    return formatString("%s (detected by rank %d)", n.cause.c_str(), n.detector);
  return formatString("%s (detected by rank %d, passed on by rank %d)", n.cause.c_str(),
                      n.detector, passedOnBy);
}

std::chrono::nanoseconds Engine::livenessGrace() const {
  // A rank in a collective polls every few ms; a quarter of the timeout (100 ms to 2 s) leaves
  // room for a loaded host without adding much to the time to the error.
  return std::clamp<std::chrono::nanoseconds>(std::chrono::milliseconds(config_.timeoutMs) / 4,
                                              std::chrono::milliseconds(100),
                                              std::chrono::seconds(2));
}

void Engine::notifyPeers(const FailureNotice& notice) noexcept {
  if (notified_)
    return;
  notified_ = true;
  // Per link: the notice has left; the peer is done with it (it passed a notice back: every
  // rank that learns of a failure tells all its links, this one included) or is gone.
  struct Telling {
    Link* link;
    bool sent = false, done = false;
  };
  std::vector<Telling> telling;
  for (Link* link : links_) {
    if (link == nullptr || !link->connected())
      continue;
    // The cause goes into the peer's notice page, the abort message names the rank at fault
    // (all a peer has if the notice cannot be read). Best effort: a full queue or a dead
    // connection just means this peer learns by timeout.
    const size_t bytes = encodeNotice(notice, link->noticeStaging(), SlotLayout::kNoticeBytes);
    const transport::LocalSegment segment{&link->headerRegion(), link->noticeStagingOffset(),
                                          bytes};
    if (link->connection().postWrite(std::span<const transport::LocalSegment>(&segment, 1),
                                     link->peerSlots, link->layout().noticeOffset(),
                                     makeImm(ImmTag::kAbort, static_cast<uint32_t>(notice.origin)),
                                     workId(WorkKind::kAbort, 0, 0)) != PostResult::kOk) {
      continue;
    }
    // The rank at fault (stopped, or dead) is not waited for.
    telling.push_back({link, false, link->abortReceived || link->peer() == notice.origin});
  }
  // Drive the connections until every notice has left (it may queue behind data) and every
  // live peer has passed one back, briefly. Without the wait a TCP socket closed right after
  // the error, with chunks still unread in its receive queue, is reset, and the peer loses the
  // notice still waiting in its own queue: it would report "connection reset", not the cause.
  const Deadline until = Deadline::after(std::chrono::milliseconds(300));
  transport::Completion sink[16];
  for (;;) {
    bool waiting = false, any = false;
    for (Telling& t : telling) {
      if (t.sent && t.done)
        continue;
      const size_t n = t.link->connection().poll(sink);
      any |= n > 0;
      for (size_t i = 0; i < n; ++i) {
        const Completion& c = sink[i];
        if (c.kind == CompletionKind::kError) {
          t.sent = t.done = true;
        } else if (c.kind == CompletionKind::kWrite && workKind(c.id) == WorkKind::kAbort) {
          t.sent = true;
        } else if (c.kind == CompletionKind::kRemoteWrite && immTag(c.imm) == ImmTag::kAbort) {
          t.link->abortReceived = true;
          t.done = true;
        }
      }
      waiting |= !(t.sent && t.done);
    }
    if (!waiting || until.expired())
      break;
    if (!any)
      waitForActivity(std::chrono::microseconds(1000));
  }
}

}  // namespace gs::stream

namespace gs::stream {

void Engine::farewell(Deadline deadline) noexcept {
  std::vector<Link*> waiting;
  for (Link* link : links_) {
    if (link == nullptr || !link->connected())
      continue;
    if (link->connection().postWrite({}, link->peerSlots, 0, makeControl(ControlCode::kBye),
                                     workId(WorkKind::kControl, 0, 0)) == PostResult::kOk) {
      waiting.push_back(link);
    }
  }
  transport::Completion sink[32];
  while (!waiting.empty() && !deadline.expired()) {
    bool any = false;
    for (size_t i = 0; i < waiting.size();) {
      Link* link = waiting[i];
      const size_t n = link->connection().poll(sink);
      bool gone = false;
      for (size_t k = 0; k < n; ++k) {
        const auto& c = sink[k];
        if (c.kind == CompletionKind::kError)
          gone = true;
        if (c.kind == CompletionKind::kRemoteWrite && isControl(c.imm, ControlCode::kBye))
          link->byeReceived = true;
      }
      any |= n > 0;
      if (gone || link->byeReceived) {
        waiting[i] = waiting.back();
        waiting.pop_back();
      } else {
        ++i;
      }
    }
    if (!any && !waiting.empty()) {
      waitForActivity(
          std::min(std::chrono::duration_cast<std::chrono::microseconds>(deadline.remaining()),
                   std::chrono::microseconds(5000)));
    }
  }
  for (Link* link : waiting) {
    GS_LOG_DEBUG("rank %d did not close the communicator in time; closing anyway", link->peer());
  }
}

}  // namespace gs::stream
