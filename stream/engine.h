#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/types.h"
#include "monitoring/counters.h"
#include "schedules/schedule.h"
#include "stream/failure_notice.h"
#include "stream/link.h"
#include "transport/device.h"

namespace gs::stream {

struct Plan;

/// One collective call as the engine sees it. Buffers are host memory.
struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  /// Wire codec of the chunks this rank encodes; null for raw. Must support dtype. Receivers
  /// decode whatever codec each chunk carries.
  const codecs::Codec* codec = nullptr;
  /// codec=auto: with codec null, each link's chunks use the codec the control plane set for
  /// that link (Engine::setLinkCodec), possibly a different one per link and per collective.
  /// Latency-bound collectives (the 2-rank exchange) stay raw.
  bool adaptive = false;
  /// Error feedback (allreduce with a lossy codec): one residual element per buffer element
  /// (codecs::residualElementSize). Every element is encoded by this rank exactly once per
  /// ring allreduce (its step-0 block, its hop re-encodes, its own block in the allgather);
  /// the engine stores there what that encoding lost. The caller adds it back next time.
  void* residual = nullptr;
  /// Allreduce schedule (other kinds always run ring / chain). Error feedback (residual) needs
  /// kRing: its accounting assumes each element is encoded once by this rank, as the ring does.
  Algorithm algorithm = Algorithm::kRing;
  /// Reduce (kReduce) schedule: the control plane picks it by size (cheapestReduce).
  ReduceAlgorithm reduceAlgorithm = ReduceAlgorithm::kChain;
  /// All-to-all with per-peer counts and displacements (alltoallv); null: `count` elements per
  /// peer, blocks back to back. Shared: a queued request and the plan cache keep it alive.
  std::shared_ptr<const AllToAllLayout> layout;
  /// Point-to-point (kind kPointToPoint, one message): the other rank; this rank sends `send`
  /// (count elements of dtype) when `sending`, else receives into `recv`.
  int peer = -1;
  bool sending = false;
};

/// One point-to-point message (gs_send / gs_recv) as the engine sees it: host memory.
struct PointToPointOp {
  bool send = true;
  int peer = -1;
  void* buffer = nullptr;  // read (send) or written (receive)
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
};

/// Where a point-to-point run gets its messages and reports them done (the communicator's
/// request queue). Both are called on the thread running Engine::runPointToPoint.
struct PointToPointFeed {
  /// Appends to `out` the messages posted since the last call, in issue order; none: none
  /// now. Asked whenever the run is idle or every message so far is done: messages posted
  /// while others are in flight join them (both ranks may post their sends first: neither
  /// waits for the other).
  std::function<void(std::vector<PointToPointOp>& out)> more;
  /// Message `index` (numbered in the order the run got them) is complete: a send once the
  /// receiver holds all of it, a receive once it is in the buffer. Called in that order.
  std::function<void(size_t index)> completed;
};

/// Figures of the last collective (for tools and, later, metrics).
struct CollectiveStats {
  uint64_t chunksSent = 0;
  uint64_t bytesSent = 0;     // payload + headers
  uint64_t bytesLogical = 0;  // the same chunks' elements before encoding
  uint64_t chunksReceived = 0;
  bool adaptive = false;   // ran with per-link codecs (CollectiveArgs::adaptive, not latency-bound)
  uint64_t elapsedNs = 0;  // the whole run, local copies included (the caller's call time)
};

/// Runs collectives as schedules over the links of one communicator: cuts steps into chunks,
/// posts each chunk as one write-with-immediate into the peer's receive slot as soon as its
/// dependencies and the peer's credits allow, reduces arrivals into place, forwards slots
/// without copying, and returns credits. Many chunks are in flight per link; every wait has a
/// deadline (no progress for Config::timeoutMs fails the collective naming the peer).
///
/// Errors: a failed connection, an invalid chunk, an abort notice from a peer, the timeout or
/// the abort flag throw gs::Error; the engine first tells its peers (best effort) so every rank
/// fails promptly, and the communicator must not run further collectives.
///
/// Not thread-safe: the communicator runs one collective at a time. Does not own the device or
/// the links; they outlive it.
class Engine {
 public:
  /// linksByPeer[p] is the link to rank p or null.
  Engine(int rank,
         int nranks,
         transport::Device& device,
         std::vector<Link*> linksByPeer,
         const Config& config,
         const std::atomic<bool>& abortFlag);
  ~Engine();

  void run(const CollectiveArgs& args);

  /// Runs point-to-point messages to completion: `first`, and whatever feed.more() adds while
  /// they run, until all are done and none is waiting. base: kind kPointToPoint, the codec
  /// (and adaptive flag) float messages are encoded with where the codec supports their dtype.
  /// Messages between a pair match in posting order (a number per pair and direction, carried
  /// in every chunk and checked); each is checked against its send (count, dtype) before any
  /// of it is written. Throws gs::Error like run(): every message of the run fails with it.
  void runPointToPoint(const CollectiveArgs& base,
                       const std::vector<PointToPointOp>& first,
                       const PointToPointFeed& feed);

  /// gs_comm_register: the caller keeps [data, data + bytes) allocated until
  /// forgetUserBuffer(data). Plans whose buffers lie inside such ranges keep their
  /// registrations across calls even on devices that pin pages (verbs), where every other plan
  /// is dropped after its call (stream/engine_registrations.cc).
  void keepUserBuffer(const void* data, size_t bytes);
  /// Drops the range registered at data and every kept plan touching it (their registrations
  /// with it). False when no range starts at data.
  bool forgetUserBuffer(const void* data);
  /// Registrations of callers' buffers with a device so far, and their bytes (metrics).
  uint64_t bufferRegistrations() const { return bufferRegistrations_; }
  uint64_t bufferRegisteredBytes() const { return bufferRegisteredBytes_; }

  /// Tells every connected peer that the communicator failed and why (once per engine; later
  /// calls do nothing). Ranks that learn of it pass the same notice on, so every rank reports
  /// the original cause, the rank at fault and the rank that found out.
  void notifyPeers(const FailureNotice& notice) noexcept;
  /// This rank failed on its own (aborted, a local error): it is origin and detector.
  void notifyPeers(Errc code, const std::string& cause) noexcept;
  /// The error text of a notice as this rank reports it: the cause, with who detected it and
  /// who passed it on; "reported at fault" when the notice names this rank.
  std::string describe(const FailureNotice& notice, int passedOnBy) const;
  /// How long a rank that timed out waits for the rank it waits on to answer a liveness check.
  std::chrono::nanoseconds livenessGrace() const;

  /// Closing handshake: tells every peer this rank is done and waits (until the deadline) for
  /// theirs, so no rank closes a connection while a neighbour still reads from it (a close
  /// with unread data resets the connection and discards what the peer had not read yet).
  void farewell(Deadline deadline) noexcept;

  const CollectiveStats& lastStats() const { return stats_; }
  /// Schedule family of the last collective: an algorithmName(), "exchange", "chain", "p2p" or
  /// "small_exchange" (the 2-rank mailbox path, engine_small.cc).
  const char* lastAlgorithm() const { return lastAlgorithm_; }

  /// Idle polling rounds before blocking in the transport. Spinning saves a wake-up per message
  /// but steals the CPU the kernel's TCP copies need when ranks outnumber cores.
  void setSpinRounds(int rounds) { spinRounds_ = rounds; }
  /// Also keep polling until this long without progress (shm: a peer's next chunk is usually
  /// microseconds away, a futex wake-up costs more). Where ranks outnumber cores, only with
  /// setYieldAfter(0), so that the poll hands the core to the rank it waits for.
  /// maxBytes > 0: only in calls moving at most that many bytes per rank (larger ones wait
  /// without polling: over tcp the kernel's copies need the core the poll would take).
  void setSpinTime(std::chrono::microseconds time, size_t maxBytes = 0) {
    spinTime_ = time;
    spinMaxBytes_ = maxBytes;
  }
  /// While polling, give the core up (sched_yield) at every idle round from this long without
  /// progress on. Default 3 us: a peer on a core of its own answers sooner than the call.
  void setYieldAfter(std::chrono::microseconds time) { yieldAfter_ = time; }
  /// Where ranks outnumber cores: a thread polling in a run is kept on the slot-th CPU of its
  /// affinity mask (common/cpu_placement.h says why), looked at every kHomeCheckPeriod of
  /// polling and moved back only when it left. -1 (default): placement is the kernel's.
  void setHomeCpuSlot(int slot) { homeCpuSlot_ = slot; }
  /// More than two ranks take the small-collective mailboxes (engine_small.cc) only where every
  /// pair of them shares memory (all on one host over shm: the same answer on every rank).
  void setSmallExchangeGroup(bool everyPairSharesMemory) { smallGroup_ = everyPairSharesMemory; }
  /// Credits short of a batch (half the slots) go back once a run has idled this long, instead
  /// of at its first idle moment (default 0). Where ranks outnumber cores that moment is core
  /// time another rank needs, and the credit a message (on tcp a system call and a wake-up)
  /// that back-to-back small calls do not need: they return credits a batch at a time.
  void setCreditFlushAfter(std::chrono::microseconds time) { creditFlushAfter_ = time; }
  /// Raw chunks from this size on are left in the sender's memory for the peer to copy, where
  /// the link allows it (shm single copy, GS_SHM_SINGLE_COPY). Below it the system call and
  /// the wait for the peer's acknowledgement cost more than the copy they save; where ranks
  /// outnumber cores that wait is a wake-up of the peer, so the communicator raises it there.
  void setSingleCopyMinBytes(uint32_t bytes) { singleCopyMinBytes_ = bytes; }
  static constexpr uint32_t kSingleCopyMinBytes = 64 << 10;

  /// Hosts of the ranks (hierarchical allreduce). Default: every rank on one host. Set before
  /// the first collective; must match on every rank.
  void setTopology(Topology topology) { topology_ = std::move(topology); }

  /// Chunk size of the next collectives (bytes, at most the slot size config.chunkBytes; every
  /// rank must set the same value before the same collective: codec=auto agrees on it).
  void setChunkBytes(int64_t bytes);
  int64_t chunkBytes() const { return chunkBytes_; }
  /// The smallest piece a reduce's pipeline cuts (reduceChunkBytes): the links' cost model's
  /// LinkCost::reducePieceBytes, alike on every rank. Default: shm's.
  void setReducePieceBytes(size_t bytes) { reducePieceBytes_ = bytes; }

  /// Links made after construction: all-to-all and the reduce tree reach peers the other
  /// schedules do not, and linking every pair up front costs a slot ring per pair. Called with
  /// the peers a schedule needs and has no link to (ascending); it must connect them all and
  /// hand each over through addLink(). Every rank running the same call asks for the matching
  /// set (schedules pair up), so the maker may connect collectively. Unset: such a call fails.
  using LinkMaker = std::function<void(const std::vector<int>& peers)>;
  void setLinkMaker(LinkMaker maker) { linkMaker_ = std::move(maker); }
  /// A link for `peer` (outlives the engine, as the constructor's); counters may be null.
  void addLink(int peer, Link* link, monitoring::LinkCounters* counters);

  /// Per-peer counters the data path updates (relaxed atomics; set up before the first
  /// collective; entries may be null).
  void setLinkCounters(std::vector<monitoring::LinkCounters*> byPeer) {
    counters_ = std::move(byPeer);
  }
  uint32_t collectivesRun() const { return collectiveId_; }

  /// Tunable of the control plane (codec=auto): the codec of the chunks this rank encodes for
  /// `peer` in adaptive collectives from the next collective on (null: raw). The codec must
  /// outlive the engine. Call between collectives only (same thread contract as run()).
  void setLinkCodec(int peer, const codecs::Codec* codec);
  /// Every how many lossy chunks per link one is decoded back to measure its error (0: never).
  void setErrorSampling(uint32_t everyN) { errorSampleEvery_ = everyN; }

 private:
  struct Run;
  struct Prepared;
  struct MessageRun;
  struct MessageRunLists;
  // Point-to-point: messages numbered per peer and direction (the chunk header's collectiveId
  // for them), and the runs so far (error messages).
  std::vector<uint32_t> messagesSent_, messagesReceived_;
  uint32_t pointToPointRuns_ = 0;
  // The point-to-point runs' state, kept from one run to the next (MessageRun::begin).
  std::unique_ptr<MessageRun> messageRun_;
  Prepared& prepare(const CollectiveArgs& args);
  // The small-collective path (engine_small.cc): whether this call takes it, and the run.
  bool takesSmallExchange(const CollectiveArgs& args) const;
  void runSmall(const CollectiveArgs& args, uint32_t id, uint64_t startNs);
  void runSmallAllReduce(const CollectiveArgs& args, uint32_t id, uint64_t startNs);
  // Links to these peers, made now where missing (a small call's peers, every rank alike).
  void makeSmallLinks(std::span<const int> peers, const CollectiveArgs& args, uint32_t bytes);
  // This call's exchange with one peer: posted, and waited for (a mismatch, a peer's failure,
  // an abort or the deadline raises, naming the peer); arrivals in smallArrivals_.
  void postSmallTo(int peer, uint64_t tag, const void* data, uint32_t bytes);
  void awaitSmall(std::span<const int> from,
                  const CollectiveArgs& args,
                  uint32_t id,
                  uint64_t tag,
                  uint32_t bytes,
                  uint64_t startNs);
  // The call's figures in stats_ and the links' counters: one block to and from each peer.
  void countSmall(std::span<const int> peers, uint32_t bytes, uint64_t startNs);
  FailureNotice smallExchangePeerNotice(Link& link, uint32_t bytes);
  // Every pair of ranks shares memory (setSmallExchangeGroup).
  bool smallGroup_ = false;
  // Per rank, reused by every small call: sequence posted, mailbox found, value to reduce.
  std::vector<uint64_t> smallSequences_;
  std::vector<transport::SmallArrival> smallArrivals_;
  std::vector<uint8_t> smallScratch_;
  std::vector<int> smallPeers_;
  void registerOnLinkDevices(Prepared& p);
  void connectMissingPeers(const Plan& plan, CollectiveKind kind);
  void addDevice(transport::Device& device);
  LinkMaker linkMaker_;
  /// Sleeps until a device has news, interrupt() or maxWait. watched (not empty): only news on
  /// those connections counts, see transport::Device::waitForActivityOn.
  void waitForActivity(std::chrono::microseconds maxWait,
                       std::span<const transport::Connection* const> watched = {});
  std::vector<const transport::Connection*> watchedConnections_;  // Run::execute's, reused
  int rank_;
  int nranks_;
  transport::Device& device_;
  // The devices serving links (device_ alone when there is none): waitForActivity() waits on
  // these, registerOnLinkDevices() registers with those other than device_.
  std::vector<transport::Device*> devices_;
  std::vector<Link*> links_;
  Config config_;
  const std::atomic<bool>& abortFlag_;
  uint32_t collectiveId_ = 0;
  CollectiveStats stats_;
  bool notified_ = false;
  // A peer's abort that arrived during a call which still completed with what had arrived
  // before it (Run::keepPeerAbort): every later call fails with its notice at once. Null: none.
  const Link* deferredAbort_ = nullptr;
  // Collectives that completed on this rank (run() returned): told to the peers in a failure
  // notice (FailureNotice::senderCompleted).
  uint32_t completedCollectives_ = 0;
  [[noreturn]] void raiseDeferredAbort(CollectiveKind kind, uint32_t id);
  // Tells the peers (notifyPeers) and throws this rank's error for the notice: "<call> #<id>
  // on rank <r>: <cause>". passedOnBy: the peer it came from (-1: found here).
  [[noreturn]] void raiseNotice(CollectiveKind kind,
                                uint32_t id,
                                const FailureNotice& notice,
                                int passedOnBy);
  // Plans and user-buffer registrations of recent calls, reused when a call repeats (training
  // loops call with the same buffers every step). Bounded; least recently used goes first.
  std::vector<std::unique_ptr<Prepared>> prepared_;
  bool registrationPinsMemory_ = false;  // some device's property: see Engine::run()
  struct UserBuffer {
    uintptr_t begin, end;
  };
  std::vector<UserBuffer> userBuffers_;  // keepUserBuffer
  uint64_t bufferRegistrations_ = 0, bufferRegisteredBytes_ = 0;
  /// Registers a caller's buffer with device, counting it, unless a kept plan holds a
  /// registration of exactly that range with device already: then that one is shared.
  std::shared_ptr<transport::MemoryRegion> registerUserMemory(transport::Device& device,
                                                              void* data,
                                                              size_t bytes);
  /// Whether every buffer range of p lies inside a range kept by keepUserBuffer.
  bool keptByUser(const Prepared& p) const;
  uint64_t useClock_ = 0;
  std::array<transport::Completion, 64> completions_;
  // A round's readiness check (Run::checkReadiness): the sockets of its links, and where each
  // link's entries begin. Scratch, reused by every run.
  std::vector<pollfd> readinessFds_;
  std::vector<uint32_t> readinessAt_;
  // Decoders by codec id (decoding depends only on the chunk's bytes) and room for one chunk of
  // reduced values between decode and re-encode.
  std::array<std::unique_ptr<codecs::Codec>, format::kNumCodecIds> decoders_;
  // Two chunk-sized buffers for compressed chunks (decode/reduce, then re-encode or decode-back),
  // allocated on first use: raw collectives never need them.
  std::array<std::vector<uint8_t>, 2> scratch_;
  uint8_t* scratch(int which) {
    auto& buf = scratch_[which];
    if (buf.empty())
      buf.resize(static_cast<size_t>(config_.chunkBytes) + 64);
    return buf.data();
  }
  std::vector<monitoring::LinkCounters*> counters_;
  const char* lastAlgorithm_ = "ring";
  std::vector<const codecs::Codec*> linkCodecs_;  // by peer; adaptive collectives
  uint32_t errorSampleEvery_ = 16;
  uint64_t lossyChunks_ = 0;  // chunks encoded by a lossy codec (error sampling clock)
  Topology topology_;
  int64_t chunkBytes_ = 0;  // config_.chunkBytes until setChunkBytes()
  size_t reducePieceBytes_ = 128 << 10;
  int spinRounds_ = 8;
  std::chrono::microseconds spinTime_{0};
  std::chrono::microseconds creditFlushAfter_{0};
  std::chrono::microseconds yieldAfter_{3};
  int homeCpuSlot_ = -1;
  Clock::time_point nextHomeCheck_{};
  void stayHome(Clock::time_point now);
  size_t spinMaxBytes_ = 0;
  uint32_t singleCopyMinBytes_ = kSingleCopyMinBytes;
  const codecs::Codec& decoder(uint8_t id) const { return *decoders_[id]; }
};

}  // namespace gs::stream
