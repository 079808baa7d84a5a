#pragma once

// The engine's private header: the execution state of one collective (Engine::Run), the plan
// cache entry (Engine::Prepared) and what the engine's files share. Engine::Run's member
// functions live by seam: engine_progress.cc, engine_send.cc, engine_recv.cc,
// engine_failure.cc; the Engine itself (construction, the plan cache, run()) in engine.cc.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "format/chunk_header.h"
#include "stream/engine.h"
#include "stream/failure_notice.h"
#include "stream/plan.h"

namespace gs::stream {

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

// The steady clock's nanoseconds, off the cycle counter (cycle::steadyNow): a small call reads
// it at each end. Readings may step back by tens of ns: subtract them with elapsedNs().
inline uint64_t nowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(cycle::steadyNow().time_since_epoch())
          .count());
}
inline uint64_t elapsedNs(uint64_t startNs, uint64_t endNs) {
  return endNs > startNs ? endNs - startNs : 0;
}

// Execution state of one collective.
struct Engine::Run {
  struct LinkRun;
  // One progress round's posts held and sent together at its end (Connection::beginPostBatch):
  // over tcp a small message's data and the notices and credits posted with it leave in one
  // system call. Ends at end() or when the round leaves, by return or by a failure's throw.
  // Only small calls batch (active): in a large one a credit held to the end of a round that
  // reduces chunks meanwhile would idle its sender.
  class PostBatch {
   public:
    PostBatch(std::vector<LinkRun>& links, bool active) : links_(links), ended_(!active) {
      if (!active)
        return;
      for (LinkRun& l : links_)
        l.link->connection().beginPostBatch();
    }
    ~PostBatch() { end(); }
    PostBatch(const PostBatch&) = delete;
    PostBatch& operator=(const PostBatch&) = delete;
    void end() {
      if (ended_)
        return;
      ended_ = true;
      for (LinkRun& l : links_)
        l.link->connection().endPostBatch();
    }

   private:
    std::vector<LinkRun>& links_;
    bool ended_;
  };
  // Calls up to this size batch their rounds' posts (PostBatch).
  static constexpr size_t kPostBatchMaxBytes = 64 << 10;
  // The chunks one postSends pass posts to a link, held and written together at its end
  // (Connection::beginGather; tcp: one writev per socket instead of one per chunk, and the
  // kernel's copy costs the sender less per byte in larger writes: a 1 MiB one-way send in 4
  // chunks took 4 x 58 us of writes, gathered 2 x 61-73). Raw chunks only: they take no time
  // to prepare, while holding chunks through the encoding of the next would delay what the
  // peer could decode. The gather begins at the pass's first chunk: a pass that posts nothing
  // (most rounds of a rank waiting for credits) makes no transport call.
  class Gather {
   public:
    Gather(transport::Connection& connection, bool allowed)
        : connection_(connection), allowed_(allowed) {}
    ~Gather() { end(); }
    Gather(const Gather&) = delete;
    Gather& operator=(const Gather&) = delete;
    // Before a raw chunk's post: from here on the pass's posts are held.
    void hold() {
      if (allowed_ && !holding_) {
        holding_ = true;
        connection_.beginGather();
      }
    }
    // What is held leaves now, and nothing more is held in this pass.
    void end() {
      allowed_ = false;
      if (holding_) {
        holding_ = false;
        connection_.endGather();
      }
    }

   private:
    transport::Connection& connection_;
    bool allowed_;
    bool holding_ = false;
  };

  struct LinkRun {
    Link* link = nullptr;
    Plan::LinkQueues* queues = nullptr;
    monitoring::LinkCounters* counters = nullptr;  // may be null
    const codecs::Codec* codec = nullptr;          // codec of the chunks this rank encodes here
    uint64_t creditBlockedSince = 0;      // cycle::now() since a ready chunk waits for a credit
    uint64_t logicalBytesSent = 0;        // this collective
    uint64_t sendBase = 0, recvBase = 0;  // link sequences of this collective's first chunks
    size_t posted = 0, completed = 0, processed = 0, releasedHere = 0;
    std::vector<uint8_t> sendDone;
    // Sends left in our memory whose write completed, waiting for the peer's read
    // acknowledgement (in order of their readOrdinal).
    std::vector<size_t> awaitingRead;
    size_t awaitingReadHead = 0;
    bool answered = false;  // a kPong came back since the last liveness check was sent
    // Landing in place (transport::Connection::landAt): whether the link's transport can, and
    // the receives armed so far (this run's queue index).
    bool lands = false;
    size_t armed = 0;
  };

  Engine& engine;
  const CollectiveArgs& args;
  Plan& plan;
  std::vector<LinkRun>& links;
  size_t elementSize;
  uint32_t collectiveId;
  std::array<Completion, 64>& completions;  // scratch, the engine's (no per-call clearing)

  // The dtype and call of an op's chunks (Plan::messages): the collective's own, or a
  // point-to-point message's. The header's collectiveId is the collective's number, or the
  // message's number on its pair and direction.
  const PlanMessage& messageOf(uint32_t message) const { return plan.messages[message]; }
  uint32_t callIdOf(uint32_t message) const {
    return args.kind == CollectiveKind::kPointToPoint ? plan.messages[message].id : collectiveId;
  }

  // Fixed codec (null: raw) or per link (CollectiveArgs::adaptive).
  const codecs::Codec* codecOn(size_t li) const { return links[li].codec; }

  // Raw chunks from this size on are left in our memory for a peer that copies them out
  // (Engine::setSingleCopyMinBytes). An allreduce's gathering chunks only from 1 MiB: below,
  // in place, the single copy made the whole call slower (2 ranks over shm, halving-doubling
  // in place, 128 KiB-1 MiB: 19-128 us against 15-113 with two copies; its reduction ran at a
  // third of its speed, perf), and out of place it gained nothing; from 1 MiB chunks it gains
  // either way (2 MiB in place 239 against 264 us).
  static constexpr uint32_t kAllReduceSingleCopyMinBytes = 1 << 20;
  uint32_t singleCopyMin;

  // Whether a raw chunk of `wireBytes` at `op` is left in our memory for the peer to copy out.
  // The single copy pays where both ends would copy anyway (an exchange, a ring, an
  // all-to-all): one copy instead of two. A rank that receives nothing in the run (a one-way
  // send, a broadcast's or scatter's root, a gather's leaf) has its core to itself, and its
  // copy into the slot runs beside the receiver's copy out of the previous chunk; the
  // receiver's process_vm_readv alone (page by page) was the slower of the two from 256 KiB:
  // 2 ranks over shm, a one-way send of 256 KiB / 1 MiB / 4 MiB / 16 MiB took 25 / 118 / 454 /
  // 3174 us single-copied against 19 / 58 / 183 / 1279 with two copies. Below that there is
  // nothing to pipeline and the single copy stays (64 KiB: 8.8 against 11.2 us).
  static constexpr uint64_t kOneWaySingleCopyMaxBytes = 256 << 10;
  bool leftForPeer(const SendOp& op, uint32_t wireBytes, Link& link) const {
    if (wireBytes < singleCopyMin || !link.connection().peerReadsOurMemory())
      return false;
    return op.stepCount * messageOf(op.message).elementSize < kOneWaySingleCopyMaxBytes ||
           receivesInRun();
  }
  // Any receive on any link of this run (a point-to-point run admits messages as it goes).
  bool receivesInRun() const {
    for (const LinkRun& l : links) {
      if (!l.queues->recvs.empty())
        return true;
    }
    return false;
  }

  Run(Engine& e, const CollectiveArgs& a, uint32_t id, Plan& p, std::vector<LinkRun>& l)
      : engine(e),
        args(a),
        plan(p),
        links(l),
        elementSize(elementSize_(a.dtype)),
        collectiveId(id),
        completions(e.completions_),
        singleCopyMin(a.kind == CollectiveKind::kAllReduce
                          ? std::max(e.singleCopyMinBytes_, kAllReduceSingleCopyMinBytes)
                          : e.singleCopyMinBytes_) {}
  static size_t elementSize_(DataType t) { return gs::elementSize(t); }

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

  // Point-to-point (engine_messages.cc): the messages, which grow while the run runs; null
  // for a collective.
  MessageRun* messages = nullptr;
  // A send of a point-to-point message is done once the receiver returned the credits of all
  // its chunks (it holds the message): credits this link still waits for.
  bool awaitsCredits(const LinkRun& l) const {
    return messages != nullptr && l.link->peerReleased < l.sendBase + l.queues->sends.size();
  }
  /// After a run: goodput and busy time per link, and each link's receive sequence moved past
  /// the chunks the run consumed.
  static void finishLinks(std::vector<LinkRun>& links, uint64_t startNs, uint64_t endNs);

  // The progress loop (engine_progress.cc): polling, completions, dependencies, deadline.
  bool satisfied(uint32_t begin, uint32_t end) const;
  bool pollLink(size_t li);
  // One poll(2) over the sockets of every link before a round polls them (transport::
  // Connection::appendReadinessFds); false where no link has sockets.
  bool checkReadiness();
  static bool isLivenessCheck(const Completion& c);
  void onCompletion(size_t li, const Completion& c);
  void onRemoteWrite(size_t li, const Completion& c);
  bool done() const;
  void execute(uint64_t startNs);  // startNs: nowNs() when the call began
  // Abort messages that arrived during this run (onRemoteWrite): it goes on with what arrived
  // before them. onPeerAborted, in idle rounds: fails once the run waits for a peer that
  // aborted, or after a grace without progress; keepPeerAbort, when the run completed anyway:
  // the engine's next call fails with the notice (Engine::deferredAbort_).
  bool peerAborted = false;
  bool waitsOn(const LinkRun& l) const;
  void onPeerAborted(std::chrono::nanoseconds idle);
  void keepPeerAbort();
  // An idle round's check that no peer has gone into a small exchange (engine_small.cc) while
  // this rank waits in a chunked call: their calls differ. Twice in a row, since the peer's
  // last chunks of the previous call may still be unpolled the first time.
  void checkPeerNotInSmallExchange();
  int peerInSmallRounds = 0;

  // Send path (engine_send.cc): headers, encoding (error feedback, sampled error), posting.
  // The header of a chunk: the one a send writes, or (RecvOp) the one its receive expects.
  template <class Op>
  void fillHeader(format::ChunkHeader* h,
                  const Op& op,
                  uint64_t seq,
                  uint8_t codecId,
                  uint32_t metaBytes,
                  uint32_t payloadBytes) const {
    memset(h, 0, sizeof(*h));
    h->magic = format::kChunkMagic;
    h->version = format::kChunkVersion;
    h->codec = codecId;
    h->dtype = static_cast<uint8_t>(messageOf(op.message).dtype);
    h->collectiveId = callIdOf(op.message);
    h->step = op.step;
    h->sequence = seq;
    h->chunkIndex = op.chunkIndex;
    h->elementCount = op.count;
    h->metaBytes = metaBytes;
    h->payloadBytes = payloadBytes;
    h->elementOffset = op.elementOffset;
    h->totalCount = totalCountOf(op.stepCount);
    h->collective = static_cast<uint8_t>(args.kind);
    h->reduceOp = static_cast<uint8_t>(args.op);
  }
  uint64_t seedOf(const SendOp& op) const;
  bool postSends(size_t li);
  void onSendComplete(size_t li, size_t index);
  // A read acknowledgement arrived: sends it covers are done.
  void onReadAck(size_t li);
  void finishSend(size_t li, size_t index);
  void decodeOwn(const format::ChunkHeader* h,
                 const uint8_t* encoded,
                 DataType dtype,
                 uint32_t count,
                 uint8_t* out);
  bool sampleError(const codecs::Codec& codec) const;
  void recordError(LinkRun& lr,
                   format::CodecId id,
                   DataType dtype,
                   const void* values,
                   const void* decoded,
                   uint32_t count) const;
  void scaleResidual(void* residual, size_t count, double factor) const;
  void* residualAt(const void* element) const;

  // Receive path (engine_recv.cc): validating, decoding, reducing, re-encoding hops, credits.
  std::string callMismatch(const format::ChunkHeader& h,
                           int peer,
                           uint64_t expectedTotal,
                           const RecvOp& op) const;
  // The chunk header's totalCount: the call's count, except an all-to-all's, whose pairs move
  // different counts (alltoallv), and a point-to-point message's: there it is the pair's (the
  // message's), so each end checks the other's.
  uint64_t totalCountOf(uint64_t stepCount) const {
    return args.kind == CollectiveKind::kAllToAll || args.kind == CollectiveKind::kPointToPoint
               ? stepCount
               : args.count;
  }
  void applyChunk(Link& link, RecvOp& op, const format::ChunkHeader& h, uint8_t* payload);
  void reencode(RecvOp& op,
                const codecs::Codec& codec,
                const uint8_t* values,
                uint8_t* slotPayload);
  bool processRecvs(size_t li);
  // Tells a transport that lands writes in place (tcp) where the raw chunks of the next
  // receives go, for as many as the link's slots (the chunks the sender may send now).
  void armLandings(size_t li);
  // Whether a receive's chunk may land in place: copied out of its slot as it is, and forwarded
  // from nowhere.
  bool landsInPlace(const RecvOp& op) const;
  // Single copy: copies a kChunkFlagPeerMemory chunk's payload (its reference is in the slot
  // after the header) from the peer's memory into `into`; fails the run naming the peer.
  void readFromPeer(size_t li,
                    const uint8_t* slotBase,
                    const format::ChunkHeader& h,
                    uint8_t* into);
  // Copies chunks left in the peer's memory that arrived but wait for their turn into their
  // slots, so the peer's buffers free up whatever this rank waits for.
  bool readAheadFromPeer(size_t li);
  bool forwardsFromDst(const RecvOp& op) const;
  // Sends the read acknowledgement when reads are unacknowledged.
  bool acknowledgeReads(size_t li);
  // Frees the slots of the receives processed (what done() counts).
  bool releaseSlots(size_t li);
  // releaseSlots, then advertises the credits once a batch is pending (flush: any; lastRound:
  // more than a batch, see engine_recv.cc).
  bool returnCredits(size_t li, bool flush, bool lastRound = false);

  // Failure handling (engine_failure.cc): blame, notices, the liveness check.
  [[noreturn]] void fail(Errc code, int blamedRank, const std::string& cause);
  [[noreturn]] void raise(const FailureNotice& notice, int passedOnBy);
  FailureNotice noticeFrom(Link& link, const Completion& c) const;
  [[noreturn]] void connectionFailed(size_t li);
  bool findAbortNotice(size_t failed, Deadline deadline, FailureNotice* notice, int* reporter);
  std::string waitingFor() const;
  size_t blockingLink() const;
  void onControl(size_t li, ControlCode code);
  void onNoProgress(Clock::time_point now);
};

// The lists a point-to-point run fills, kept by the engine from one run to the next
// (Engine::messageRun_) with what they allocated: a loop of small sendrecvs built them
// afresh on every call (14 of a sendrecv's 30 allocations per rank).
struct Engine::MessageRunLists {
  struct Message {
    size_t link;  // index in links
    bool send;
    size_t end;   // one past its last op in that link's sends or receives
    uint32_t id;  // its number on its pair and direction (MessageInput::id)
    uint64_t count;
    DataType dtype;
    bool announced = false;  // a receive whose sender was told it is posted
    bool done = false;       // a send whose completion condition held (completeSends), a
                             // receive from a box copied out
    // Small messages over links with message boxes (transport::Connection::postBox) travel
    // there instead of as chunks: `box` is its box use, `buffer` what it reads or writes.
    bool boxed = false;
    bool posted = false;    // a boxed send written into its box
    bool expected = false;  // a boxed receive its sender was told of (expectBoxes)
    uint64_t box = 0;
    void* buffer = nullptr;
  };
  // plan.links keeps entries past the run's links, their queues emptied, for their capacity:
  // MessageRun::queuesUsed of them are the run's.
  Plan plan;
  std::vector<Run::LinkRun> links;
  std::vector<int> linkOf;  // by peer: index in links, -1 before its first message
  std::vector<std::unique_ptr<transport::MemoryRegion>> regions;  // the sends' buffers
  std::vector<Message> list;
  // By link: its sends (indices in list) and how many of them completed, in order. Sends
  // complete per link, whatever the messages to other peers before them in list are waiting
  // for: Link::messagesSentDone must keep up with what the receiver completed, or its notices
  // would fall outside the window a sender keeps (PostedReceives::kAccept). sendsOf may hold
  // more (emptied) entries than there are links, for their capacity.
  std::vector<std::vector<size_t>> sendsOf;
  std::vector<size_t> sendsDone;
  std::vector<std::vector<uint8_t>> spareSendDone;  // LinkRun::sendDone vectors to reuse
  std::vector<PointToPointOp> incoming;             // what feed.more() added last
  std::vector<bool> checkedLinks;                   // MessageRun::checkNotInBox's

  // Empties every list for the next run, keeping what they allocated; ends the registrations.
  void clear();
};

// The messages of one point-to-point run (Engine::runPointToPoint, engine_messages.cc). The
// run's plan and links grow as messages join: both are reserved for every peer up front, so
// the Run's references and each LinkRun's queues pointer stay valid. The engine keeps one from
// run to run (Engine::messageRun_), its lists emptied, with what they allocated.
struct Engine::MessageRun : Engine::MessageRunLists {
  Engine& engine;
  const CollectiveArgs* base = nullptr;  // this run's (begin)
  const PointToPointFeed* feed = nullptr;
  size_t queuesUsed = 0;    // entries of plan.links this run uses
  size_t reported = 0;      // messages reported complete (in order)
  size_t announceFrom = 0;  // messages from here on may hold receives not yet announced
  // The run holds a receive whose sender waits for its credits (it was not announced): credits
  // go back at every idle moment and before the run ends. With announced receives only, they
  // go back a batch at a time or after kAnnouncedCreditHold of idling.
  bool owesCredits = false;
  uint32_t idleRounds = 0;  // progress rounds in a row without progress
  size_t chunked = 0;       // messages admitted that travel in chunks, not in a box

  explicit MessageRun(Engine& e) : engine(e) {}
  MessageRun(const MessageRun&) = delete;
  MessageRun& operator=(const MessageRun&) = delete;
  /// A new run on the lists the last one left (they are never moved: a run object per run
  /// moved a dozen of them in and out; the saving was within noise, the code simpler).
  void begin(const CollectiveArgs& b, const PointToPointFeed& f);
  /// Releases the sends' registrations and empties the lists for the next run.
  void end() { clear(); }
  void admit(const std::vector<PointToPointOp>& ops);
  /// Reports the messages done since the last call (in order) and admits new ones: once per
  /// round of the progress loop. idle: the round made no progress.
  bool advance(Run& run, bool idle);
  /// Every message reported and every credit owed to a sender returned.
  bool finished() const;
  /// Tells the senders of boxed receives not yet done that they are posted
  /// (transport::Connection::expectBox): a send whose receive agrees completes without
  /// waiting for the box to be taken.
  void expectBoxes();
  /// A run whose messages all travel in boxes, without the progress loop (Run::execute) while
  /// the peers answer within a few idle rounds: true once finished, false where the run needs
  /// the loop (a message in chunks, a box that disagrees, a failure, a peer slow to answer).
  bool runBoxed();

 private:
  size_t linkFor(int peer);
  static bool travelsRaw(const Run::LinkRun& lr, DataType dtype);
  // Receive posted notices (stream/posted_receive.h): the receiver's announcement, and the
  // sender's test of a send whose writes completed (throws on a notice that disagrees).
  // Receives are announced in the progress round, not where they are admitted: the round's
  // post batch then carries the notices with the round's data (one writev over tcp).
  void announceReceives();
  bool announceReceive(const Message& m);
  bool receiverPosted(Run& run, const Message& m);
  // run: null in runBoxed, where only a taken box completes a boxed send.
  void completeSends(Run* run);
  // Reports the messages done, in order (run: null where every message is boxed).
  bool reportDone(Run* run);
  // What feed.more() adds, admitted; false when it added nothing.
  bool admitMore();
  // Message boxes (engine_boxes.cc): whether a message travels in one (both ends decide alike
  // from what they both know: their counts, which must agree, the link, the configuration);
  // posting the boxed sends in order as boxes free; copying boxed receives out; and, when
  // idle, the receiver's check that a message it expects in chunks did not come in a box, and
  // the notices of boxed receives that have waited a while.
  bool travelsInBox(const Run::LinkRun& lr, const PointToPointOp& op) const;
  bool postBoxes();
  // run: null in runBoxed, which leaves a failed connection or a box that disagrees to the
  // progress loop (false, with boxTrouble set).
  bool takeBoxes(Run* run);
  bool boxTrouble = false;
  void announceWaitingBoxes();
  void checkNotInBox(Run& run);
};

struct Engine::Prepared {
  CollectiveArgs key;
  Schedule schedule;
  // Registrations of the caller's buffers with the primary device, shared with other plans over
  // the same buffers (the schedules GS_ALGO_TUNE tries, say): see Engine::registerUserMemory.
  std::shared_ptr<transport::MemoryRegion> sendRegion, recvRegion;
  struct DeviceRegion {
    transport::Device* device;
    std::shared_ptr<transport::MemoryRegion> region;
  };
  std::vector<DeviceRegion> otherRegions;  // see registerOnLinkDevices
  Plan plan;
  std::vector<Run::LinkRun> links;
  uint64_t lastUse = 0;
  const char* algorithm = "ring";
  int64_t chunkBytes = 0;  // chunk size the plan was cut with
  bool adaptive = false;

  bool matches(const CollectiveArgs& a) const {
    return a.kind == key.kind && a.send == key.send && a.recv == key.recv && a.count == key.count &&
           a.dtype == key.dtype && a.op == key.op && a.root == key.root && a.codec == key.codec &&
           a.adaptive == key.adaptive && a.algorithm == key.algorithm &&
           a.reduceAlgorithm == key.reduceAlgorithm &&
           (a.layout == nullptr) == (key.layout == nullptr) &&
           (a.layout == nullptr || *a.layout == *key.layout);
  }
};

}  // namespace gs::stream
