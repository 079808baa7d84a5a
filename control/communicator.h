#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "codecs/codec.h"
#include "codecs/device_memory.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/error.h"
#include "control/adaptive_controller.h"
#include "control/algorithm_tuner.h"
#include "control/device_staging.h"
#include "control/last_collective.h"
#include "control/link_transports.h"
#include "control/message_staging.h"
#include "control/peer_links.h"
#include "control/unique_id.h"
#include "monitoring/metrics.h"
#include "schedules/cost_model.h"
#include "stream/engine.h"
#include "stream/link.h"
#include "transport/device.h"

namespace gs::control {

struct PeerInfo;

/// Completion state of a non-blocking collective. Shared by the caller's handle and the
/// communicator's progress thread; thread-safe.
class Request {
 public:
  /// issued: where the caller's CUDA stream stood when the call was made (null: no stream).
  explicit Request(stream::CollectiveArgs args, std::unique_ptr<StreamMark> issued = nullptr)
      : args_(args), issued_(std::move(issued)), created_(cycle::steadyNow()) {}
  const stream::CollectiveArgs& args() const { return args_; }
  const StreamMark* issued() const { return issued_.get(); }
  Clock::time_point created() const { return created_; }
  /// A point-to-point message (gs_send / gs_recv / gs_isend / gs_irecv).
  bool isMessage() const { return args_.kind == stream::CollectiveKind::kPointToPoint; }
  /// Someone will not run it (a callback, gs_test, a short wait): the progress thread starts it
  /// without leaving it to a waiter first (Communicator::hurry).
  void hurry() { hurried_.store(true, std::memory_order_relaxed); }
  bool hurried() const { return hurried_.load(std::memory_order_relaxed); }

  /// Called once when the request completes, with its status and message.
  using Callback = std::function<void(Errc, const std::string&)>;

  /// Marks the request done, wakes its waiters, then runs the callbacks (outside the lock, on
  /// the completing thread: the progress thread, or the thread that completed it early).
  void complete(Errc code, std::string message);
  /// Runs fn once the request is complete: at once on this thread when it already is,
  /// otherwise on the thread that completes it. fn must not wait for later requests of the
  /// same communicator (the progress thread is running fn).
  void onComplete(Callback fn);
  bool done() const;
  /// Waits until done or the deadline; returns whether it is done.
  bool waitUntil(Deadline deadline) const;
  Errc status() const;
  std::string message() const;

 private:
  void runCallback(const Callback& fn) const noexcept;  // logs what fn throws

  stream::CollectiveArgs args_;
  std::unique_ptr<StreamMark> issued_;
  Clock::time_point created_;
  std::atomic<bool> hurried_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  // Set under mutex_ (with the status and message before it), read without it: done() is
  // asked several times per message by the waiting thread and the queue.
  std::atomic<bool> done_{false};
  Errc status_ = Errc::kOk;
  std::string message_;
  std::vector<Callback> callbacks_;  // guarded by mutex_; run and cleared by complete()
};

/// One rank's membership in a communicator: the transport device, a link per peer its schedules
/// exchange chunks with (ring neighbours, tree / halving-doubling / hierarchical partners),
/// the engine, and a progress thread for non-blocking calls (started on first use).
///
/// Collectives on one communicator run one at a time in issue order; blocking calls from
/// several threads are serialized. abort() may be called from any thread. After a collective
/// fails, the communicator is broken: every later call reports that first error. Destroying it
/// waits for queued requests (each bounded by the timeout).
class Communicator {
 public:
  /// Joins the communicator through rank 0's rendezvous (collective, blocking, deadline from
  /// config.timeoutMs).
  static std::unique_ptr<Communicator> create(int nranks,
                                              const UniqueId& id,
                                              int rank,
                                              const Config& config);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return nranks_; }
  const Config& config() const { return config_; }
  /// The transports carrying this rank's links: the network one ("tcp", "verbs", "loopback"),
  /// "shm" when every link is over shared memory, or "shm+tcp" / "shm+verbs" when both serve
  /// links. Set by create(); per rank (a rank with no same-host peer says "tcp").
  std::string transportName() const { return transportName_; }

  /// Runs a collective to completion on this rank. Throws gs::Error.
  ///
  /// CUDA: buffers may be device memory (then they go through pinned host staging, see
  /// DeviceStaging: the call returns once the host part is done and the result copies are
  /// enqueued on cudaStream, null meaning the legacy default stream). Host buffers with a
  /// non-null cudaStream first wait for the work enqueued on that stream.
  ///
  /// Error feedback (args.residual, in-place allreduce): the residual is added to the input
  /// right before the collective reads it (after the stream's producers; into the staged copy
  /// for device buffers) and replaced by what this call's encodings lost.
  void run(const stream::CollectiveArgs& args, CUstream_st* cudaStream = nullptr);
  /// Queues a collective for the progress thread. CUDA: with device buffers or a non-null
  /// cudaStream, the collective sees what the stream's work enqueued before this call wrote
  /// (an event recorded now), its copies run on the communicator's own stream, and the request
  /// completes once the results are in the buffers. args.residual: as run().
  std::shared_ptr<Request> submit(const stream::CollectiveArgs& args,
                                  CUstream_st* cudaStream = nullptr);

  /// Waits until request (one of this communicator's) is done or the deadline passes; returns
  /// whether it is done. mayRun: while it is still queued and no thread runs the queue, the
  /// waiting thread runs the queue up to it itself (issue order kept; the engine's timeout then
  /// bounds the wait, not the deadline, so short waits pass false): a thread that waits right after
  /// issuing, as gs_send / gs_recv and isend-irecv-wait do, saves the two hand-offs to the progress
  /// thread and back, which cost tens of microseconds, more where ranks outnumber cores. Completion
  /// callbacks then run on this thread.
  bool wait(const std::shared_ptr<Request>& request, Deadline deadline, bool mayRun = true);
  /// The caller will not run request (it registered a callback, tests it or waits briefly):
  /// the progress thread starts it now rather than leaving it to a waiter for a moment.
  void hurry(const std::shared_ptr<Request>& request);

  /// gs_comm_register / gs_comm_deregister (communicator_buffers.cc): waits for a running
  /// collective. deregisterBuffer throws kInvalidArgument for an address never registered.
  void registerBuffer(void* data, size_t bytes);
  void deregisterBuffer(void* data);

  /// The CUDA device holding p, or -1 for host-readable memory (always -1 without CUDA).
  int bufferDevice(const void* p);

  /// Where device buffers are recognized and copied: the CUDA runtime unless set (tests set a
  /// host-memory fake). Set before the first collective.
  void setDeviceMemory(std::shared_ptr<codecs::DeviceMemory> memory);

  /// gs_comm_split: collective over this communicator. Ranks passing one color (>= 0) form a
  /// new communicator, ranked by key then by rank here; color -1 (GS_SPLIT_NOCOLOR) returns
  /// null. The members' records travel over this communicator (no rendezvous server, no unique
  /// id); the child's links and devices are its own, each link made at its first use.
  /// `config` gives the member's settings; it runs inside the split, so a member whose settings
  /// are refused still takes part and the others fail naming it rather than waiting for it.
  std::unique_ptr<Communicator> split(int color, int key, const std::function<Config()>& config);

  void abort();
  const stream::CollectiveStats& lastStats() const { return engine_->lastStats(); }
  /// codec=auto: the controller (null for a fixed codec). Read it only between collectives.
  const AdaptiveController* controller() const { return controller_.get(); }

  /// Figures of this rank (thread-safe; may run while a collective does).
  struct Stats {
    monitoring::Snapshot snapshot;
    double lastSeconds = 0, lastAlgbw = 0, lastBusbw = 0;
    std::string metricsAddress;
    std::string lastAlgorithm;  // "" before the first collective
  };
  Stats stats() const;

 private:
  Communicator(int nranks, int rank, const Config& config);

  // ---- joining (communicator_connect.cc), the steps of connect() in the order they run ----
  struct LinkPlan;  // which device carries the link to each peer
  /// A communicator with its settings and codec checked, joined to nothing yet (create() and
  /// split() then join it).
  static std::unique_ptr<Communicator> unconnected(int nranks, int rank, const Config& config);
  /// Rendezvous at `id`'s server: devices, records through the server, then join().
  void connect(const UniqueId& id);
  /// This rank's record for the others: who it is, the settings all must share, and its
  /// devices' addresses (openDevices first).
  PeerInfo ownRecord() const;
  /// When join() connects the links its schedules use: at once (create(): a communicator whose
  /// links cannot be made fails there), or when a call first needs each (split(): a group
  /// nobody calls on costs no connections, slots or shared memory).
  enum class Links { kNow, kAtFirstUse };
  /// Links, cost model, metrics, engine from every rank's record (parsed and checked): the
  /// rest of what create() promises.
  void join(Deadline deadline, const std::vector<PeerInfo>& infos, Links links = Links::kNow);
  /// Opens the network device (and the shm device next to it, when wanted), listening where the
  /// other ranks can reach this one. Returns the options they were opened with.
  transport::DeviceOptions openDevices(const Secret& secret,
                                       const std::string& addressReachingRank0);
  /// Topology from the ranks' host names, the algorithms GS_ALGO allows on it, and the peers
  /// their schedules use (the same on every rank: all computed from every record).
  std::set<int> chooseSchedules(const std::vector<PeerInfo>& infos);
  /// Clears the shm addresses (in transports_) of the hosts whose shm links would not fit in
  /// their /dev/shm (dropShmWhereSlotsDoNotFit), warning on this rank's host. myPeers: this
  /// rank's schedule peers (chooseSchedules), the others' are built only where needed.
  void leaveShmWhereSlotsDoNotFit(const std::vector<PeerInfo>& infos, const std::set<int>& myPeers);
  /// Per peer shm or the network (symmetric); frees the shm device when no link uses it.
  LinkPlan planLinks(const std::vector<PeerInfo>& infos, std::set<int> peers);
  void logLinkTransports(int shmLinks, int networkLinks, int localOverNetwork) const;
  void setUpCostModel(const std::vector<PeerInfo>& infos);
  /// The cost model's codecRatio for chunks in `codec` (null: raw, 1).
  static double wireRatio(const codecs::Codec* codec);
  /// Returns each linked peer's counters, by rank (null without a link).
  std::vector<monitoring::LinkCounters*> startMetrics(const std::vector<PeerInfo>& infos,
                                                      const LinkPlan& plan,
                                                      const std::string& bindAddress);
  void startEngine(const std::vector<PeerInfo>& infos,
                   const LinkPlan& plan,
                   std::vector<monitoring::LinkCounters*> counters);
  void logReady(const LinkPlan& plan, const std::string& bindAddress) const;
  /// Where the link to `peer` goes: shm when both ranks can (symmetric), else the network;
  /// *transport says which. Needs the records kept by connect().
  PeerEndpoint endpointFor(int peer, std::string* transport) const;
  stream::SlotLayout slotLayout() const;
  /// The engine's LinkMaker: links to peers that only some schedules use (all-to-all, the
  /// reduce tree), made when a call first needs them; every rank of that call makes its
  /// matching ones at the same point, as at creation (connectPeerLinks).
  void linkLater(const std::vector<int>& peers);

  /// An int32 allgather over this communicator (split's rounds).
  std::vector<int32_t> allgatherInts(std::vector<int32_t> mine);
  /// Every rank's byte string over this communicator, its length known from a previous
  /// allgatherInts (each <= kMaxRendezvousPayload, empty allowed): the strings padded to the
  /// longest. A length out of bounds (bytes from a peer) throws kRemote naming its rank.
  std::vector<std::vector<uint8_t>> allgatherPadded(std::span<const uint8_t> mine,
                                                    const std::vector<int32_t>& lengths);

  // ---- running collectives (communicator.cc) ----
  // ---- point-to-point (communicator_messages.cc) ----
  /// The progress thread's run of point-to-point requests: `first` and every one queued
  /// behind it, those posted meanwhile included (Engine::runPointToPoint), each completed as
  /// its message is done. A failure completes the rest with the error.
  /// waiter: the request the thread running this waits for (null: the progress thread); once
  /// it is done, later messages are left to the progress thread.
  void runMessages(const std::shared_ptr<Request>& first, const Request* waiter);
  /// Takes the front request off the queue and runs it with queueRunning_ set (lock held on
  /// entry and exit, released meanwhile).
  void runFront(std::unique_lock<std::mutex>& lock, const Request* waiter);
  /// Runs one request taken off the queue to completion (progress thread or a waiter).
  void runQueued(const std::shared_ptr<Request>& request, const Request* waiter);
  /// gs_send / gs_recv: queued like gs_isend / gs_irecv (so they run with the messages around
  /// them) and waited for. Device buffers or a stream: as submit() (a StreamMark at the call,
  /// the copies through MessageStaging); returns once a received message is in device memory.
  void runMessage(const stream::CollectiveArgs& args, CUstream_st* cudaStream);
  /// The pinned staging of device-buffer messages (made on first use; holds execMutex_).
  MessageStaging& messageStaging();
  /// Puts a request in the running message batch (runBatch_) and returns what the engine runs
  /// for it: its host buffer, or for device memory a pinned one (holding a send's bytes once
  /// this returns). Host buffers with a stream wait for the mark.
  stream::PointToPointOp admitMessage(const std::shared_ptr<Request>& request);
  /// runMessages' feed: appends the messages queued now (see PointToPointFeed::more).
  void takeQueuedMessages(std::vector<stream::PointToPointOp>& out);
  /// A failed message run: completes the batch's requests from `completed` on (the first
  /// alone when none joined) with the error.
  void completeRest(const std::shared_ptr<Request>& first,
                    size_t completed,
                    Errc code,
                    const char* message);

  /// Holds execMutex_. record: count it as one collective in the metrics and stats (pieces of
  /// a staged call are counted once, by runStaged).
  void execute(const stream::CollectiveArgs& args, bool record = true);
  /// Blocking calls (cudaStream, issued null) and requests of the progress thread (issued: where
  /// the caller's stream stood, null without a stream).
  void runStaged(const stream::CollectiveArgs& args,
                 CUstream_st* cudaStream,
                 const StreamMark* issued = nullptr);
  /// Host buffers, once their producers are done: adds args.residual to the input (see run()),
  /// then executes.
  void runHost(const stream::CollectiveArgs& args);
  /// The CUDA runtime (or the fake), null where none can run; reason() then says why.
  codecs::DeviceMemory* deviceMemory();
  /// A call with a CUDA stream (or device buffers) needs deviceMemory(): kUnsupported naming why
  /// there is none.
  void checkStreamUsable(const codecs::DeviceMemory* memory) const;
  void fail(const Error& e);  // marks the communicator broken by e
  /// codec=auto: every rank runs this before the same adaptive collective (every
  /// kChunkAgreementEvery-th): a raw 8-byte MIN allreduce of the controllers' chunk proposals,
  /// whose result every rank then applies, so all cut the next collectives alike.
  void agreeOnChunkSize();
  uint64_t adaptiveCalls_ = 0;  // guarded by execMutex_
  /// Runs a raw int64 allreduce of `values` in place on the engine, outside any request: every
  /// rank must call it at the same point of its call sequence (the agreements above and the
  /// tuner's). Holds execMutex_.
  void agreeInternally(std::vector<int64_t>& values, ReduceOp op);
  /// Schedules with their predicted seconds, cheapest first (chooseAlgorithm).
  using PricedAlgorithms = std::vector<std::pair<double, stream::Algorithm>>;
  struct TunedChoice {
    stream::Algorithm algorithm;
    bool trial;  // one of the trial calls: not to be remembered as the size's choice
  };
  /// GS_ALGO_TUNE: the allreduce schedule measured among those the model prices close
  /// (control/algorithm_tuner.h); nullopt where tuning does not apply to this call.
  std::optional<TunedChoice> tunedAlgorithm(const stream::CollectiveArgs& args,
                                            const PricedAlgorithms& priced);
  /// GS_ALGO_TUNE for this communicator's topology and links; computed at the first call
  /// (from records that do not change after set-up) and kept.
  bool tuneHere();
  std::optional<bool> tuneHere_;  // guarded by execMutex_
  bool crowdedHost() const;       // GS_ALGO_TUNE=crowded's test
  void progressLoop();
  void checkUsable() const;
  void recordCollective(const stream::CollectiveArgs& args, double seconds);
  stream::Algorithm chooseAlgorithm(const stream::CollectiveArgs& args);     // holds execMutex_
  stream::ReduceAlgorithm chooseReduce(const stream::CollectiveArgs& args);  // holds execMutex_
  /// Reduce through the tree off the root: the partial sums go here, never into the caller's
  /// recvbuff (which may be NULL there). Guarded by execMutex_.
  std::vector<uint8_t> reduceScratch_;
  stream::ReduceAlgorithm lastReduceChoice_ = stream::ReduceAlgorithm::kChain;
  std::optional<stream::ReduceAlgorithm> fixedReduce_;  // GS_REDUCE_ALGO other than auto
  bool reduceChosen_ = false;

  int nranks_;
  int rank_;
  Config config_;
  std::string networkTransport_;  // resolved GS_TRANSPORT: tcp, verbs or loopback
  std::string bindAddress_;       // where this rank's devices listen (split's rendezvous too)
  std::string transportName_;     // see transportName()
  ShmState shmState_ = ShmState::kOff;
  stream::Topology topology_;
  // From the rendezvous records, kept for links made later (linkLater): by rank.
  std::vector<TransportEndpoint> transports_;
  // The chunk every call is cut into (pipelineChunkBytes of the records; at most the slot size
  // config_.chunkBytes). codec=auto's controller moves it later.
  int64_t pipelineChunk_ = 0;
  std::vector<std::vector<uint8_t>> networkAddresses_;
  std::vector<stream::Algorithm> algorithms_;  // what GS_ALGO allows, see allowedAlgorithms
  stream::CostModel costModel_;
  stream::Algorithm lastChoice_ = stream::Algorithm::kRing;
  // The last allreduce choices of the cost model: it is evaluated once per (size, codec,
  // adaptive), not per call (5 predictions cost ~0.4 us, a third of a 2-rank 8 B allreduce).
  // Deterministic on every rank, so a remembered choice agrees as a computed one does.
  struct AlgorithmChoice {
    size_t bytes = SIZE_MAX;
    const codecs::Codec* codec = nullptr;
    bool adaptive = false;
    stream::Algorithm algorithm = stream::Algorithm::kRing;
  };
  static constexpr size_t kRememberedChoices = 16;
  std::array<AlgorithmChoice, kRememberedChoices> choices_{};  // guarded by execMutex_
  size_t nextChoice_ = 0;                                      // round-robin replacement
  AlgorithmTuner tuner_;                                       // guarded by execMutex_
  // Declared in acquisition order: links and engine go before the devices they use, the engine
  // before the metrics it updates.
  std::unique_ptr<transport::Device> device_;     // the network transport
  std::unique_ptr<transport::Device> shmDevice_;  // same-host peers; null when off or unavailable
  std::vector<std::unique_ptr<stream::Link>> links_;
  std::unique_ptr<monitoring::Metrics> metrics_;
  std::unique_ptr<stream::Engine> engine_;
  std::unique_ptr<codecs::Codec> codec_;            // null: raw (or codec=auto)
  std::unique_ptr<AdaptiveController> controller_;  // codec=auto

  std::atomic<bool> aborted_{false};
  std::mutex deviceMemoryMutex_;
  bool deviceMemoryResolved_ = false;
  // Once resolved, deviceMemory() answers from here without the lock (every call asks it).
  std::atomic<bool> deviceMemoryKnown_{false};
  codecs::DeviceMemory* deviceMemoryKnownPtr_ = nullptr;  // published by deviceMemoryKnown_
  std::shared_ptr<codecs::DeviceMemory> deviceMemory_;    // null: no CUDA here
  std::string deviceMemoryUnavailable_;                   // why, when null
  std::unique_ptr<DeviceStaging> staging_;                // first device-buffer call
  std::unique_ptr<MessageStaging> messageStaging_;        // first device-buffer message
  // The message run in progress (runMessages): its requests in the order the engine got them,
  // and by the same index the pinned buffer a device message travels through (null: none);
  // scratch for what it takes off the queue. Members, so that a loop of small messages does
  // not allocate them per run; only the thread running the queue (queueRunning_) uses them.
  std::vector<std::shared_ptr<Request>> runBatch_;
  std::vector<void*> runPinned_;
  std::vector<std::shared_ptr<Request>> runTaken_;
  std::vector<stream::PointToPointOp> runFirst_;
  bool stagingLogged_ = false;  // the path's info line went out
  std::mutex execMutex_;        // one collective at a time; guards the links and engine
  mutable std::mutex stateMutex_;
  std::optional<Error> failure_;     // guarded by stateMutex_
  std::atomic<bool> failed_{false};  // failure_ is set: checkUsable locks only then
  LastCollective last_;

  std::mutex queueMutex_;
  std::condition_variable queueCv_;
  std::deque<std::shared_ptr<Request>> queue_;
  // queue_.size(), written under queueMutex_: a message run's idle rounds look here before
  // they take the lock to find nothing queued (runMessages' feed).
  std::atomic<size_t> queueLength_{0};
  bool queueRunning_ = false;  // a request taken off the queue runs (progress thread or waiter)
  int idleWaiters_ = 0;        // blocking calls and the destructor waiting for the queue to be idle
  bool workerPolling_ = false;       // the progress thread looks at the queue within kPollPeriod
  Clock::time_point lastMessage_{};  // the last message queued (the progress thread polls)
  bool inlineBusy_ = false;
  bool stopping_ = false;
  // The issue-order gate's fast path (run()): a blocking call while nothing is queued, running
  // or waiting takes the gate with one compare-and-swap instead of two sections under
  // queueMutex_. kGateSlow says, kept under queueMutex_ by updateGate(), that any of that is
  // active; kGateFast is a blocking call on the fast path, which whatever waits for inlineBusy_
  // waits for as well (inlineBusy()). A fast call that finds kGateSlow set as it leaves clears
  // kGateFast under the lock and wakes the waiters.
  static constexpr uint32_t kGateFast = 1, kGateSlow = 2;
  std::atomic<uint32_t> gate_{0};
  void updateGate();        // queueMutex_ held, after any change to what kGateSlow sums up
  bool inlineBusy() const;  // queueMutex_ held: a blocking call runs (either path)
  void leaveFastGate();
  std::thread worker_;
};

}  // namespace gs::control
