// The Engine: construction, the plan cache (a collective that repeats reuses its schedule,
// plan and buffer registrations) and run(), which prepares a call and hands it to Engine::Run
// (engine_run.h; its seams in engine_progress.cc, engine_send.cc, engine_recv.cc,
// engine_failure.cc).
#include "stream/engine.h"

#include <sched.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "codecs/reduce.h"
#include "common/cpu_placement.h"
#include "common/cycle_clock.h"
#include "common/error.h"
#include "common/log.h"
#include "format/chunk_header.h"
#include "stream/engine_run.h"
#include "stream/plan.h"

namespace gs::stream {

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
    if (link != nullptr)
      addDevice(link->device());
  }
  if (devices_.empty())
    addDevice(device_);
  if (nranks_ == 1)
    cycle::calibrate();  // here, not in a call it would time (Engine::run)
  for (int id = 0; id < format::kNumCodecIds; ++id) {
    codecs::CodecSpec spec;
    spec.id = static_cast<format::CodecId>(id);
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

void Engine::addDevice(transport::Device& device) {
  if (std::find(devices_.begin(), devices_.end(), &device) != devices_.end())
    return;
  devices_.push_back(&device);
  registrationPinsMemory_ |= device.properties().registrationPinsMemory;
}

void Engine::addLink(int peer, Link* link, monitoring::LinkCounters* counters) {
  GS_CHECK(peer >= 0 && peer < nranks_ && peer != rank_ && link != nullptr, Errc::kInternal,
           "no link can be added for rank %d", peer);
  links_[peer] = link;
  // The primary device alone stood in for "no link at all"; it stays: it registers buffers.
  addDevice(link->device());
  if (counters_.size() < static_cast<size_t>(nranks_))
    counters_.resize(static_cast<size_t>(nranks_), nullptr);
  counters_[peer] = counters;
}

void Engine::connectMissingPeers(const Plan& plan, CollectiveKind kind) {
  std::vector<int> missing;
  for (const auto& q : plan.links) {
    GS_CHECK(q.peer >= 0 && q.peer < nranks_, Errc::kInternal, "schedule names rank %d of %d",
             q.peer, nranks_);
    if (links_[q.peer] == nullptr)
      missing.push_back(q.peer);
  }
  if (missing.empty())
    return;
  GS_CHECK(linkMaker_, Errc::kInternal, "no connection to rank %d for %s", missing.front(),
           collectiveName(kind));
  std::sort(missing.begin(), missing.end());
  linkMaker_(missing);
}

void Engine::setLinkCodec(int peer, const codecs::Codec* codec) {
  if (peer < 0)
    return;
  if (static_cast<size_t>(peer) >= linkCodecs_.size())
    linkCodecs_.resize(static_cast<size_t>(peer) + 1, nullptr);
  linkCodecs_[peer] = codec;
}

namespace {
constexpr size_t kPreparedCapacity = 16;
// codec=auto compresses calls above this size only: below it a round trip, not the bytes, is
// what a call costs, so a lossy rung would lose precision for nothing.
constexpr size_t kAdaptiveMinBytes = 64 << 10;
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
  const size_t bytes = args.count * esize;
  // codec=auto leaves latency-bound collectives raw (their round trip, not bytes, is the cost).
  p->adaptive = args.adaptive && args.codec == nullptr && bytes > kAdaptiveMinBytes;
  // A 2-rank ring allreduce up to kExchangeMaxBytes is one round of messages. (Raw only: with a
  // lossy codec each rank would reduce its own exact value with the peer's decoded one, and
  // replicas would differ; nor while codec=auto may pick a lossy rung.)
  const bool exchange = args.codec == nullptr && !p->adaptive && bytes <= kExchangeMaxBytes;
  if (args.kind == CollectiveKind::kAllReduce) {
    GS_CHECK(args.residual == nullptr || args.algorithm == Algorithm::kRing, Errc::kInvalidArgument,
             "error feedback needs the ring allreduce, not %s", algorithmName(args.algorithm));
    p->schedule = buildAllReduce(args.algorithm, rank_, topology_, args.count, exchange);
    p->algorithm = args.algorithm == Algorithm::kRing && exchange && nranks_ == 2
                       ? "exchange"
                       : algorithmName(args.algorithm);
  } else if (args.kind == CollectiveKind::kReduce) {
    p->schedule = buildReduce(args.reduceAlgorithm, rank_, nranks_, args.root, args.count);
    p->algorithm = reduceAlgorithmName(args.reduceAlgorithm);
  } else if (args.kind == CollectiveKind::kAllToAll) {
    p->schedule = pairwiseAllToAll(
        rank_, nranks_,
        args.layout != nullptr ? *args.layout : AllToAllLayout::uniform(nranks_, args.count));
    p->algorithm = "pairwise";
  } else {
    p->schedule = buildSchedule(args.kind, rank_, nranks_, args.root, args.count, exchange);
    p->algorithm = args.kind == CollectiveKind::kBroadcast ? "chain" : "ring";
  }
  const auto* send = static_cast<const uint8_t*>(args.send);
  auto* recv = static_cast<uint8_t*>(args.recv);
  if (!p->schedule.steps.empty()) {
    // Registration is cheap for tcp and loopback (a bounds record); verbs pins the pages, so
    // run() drops these regions when the call ends (registrationPinsMemory_) unless the caller
    // registered the buffers (keepUserBuffer).
    if (p->schedule.sendCount > 0) {
      p->sendRegion =
          registerUserMemory(device_, const_cast<uint8_t*>(send), p->schedule.sendCount * esize);
    }
    if (p->schedule.recvCount > 0) {
      p->recvRegion = registerUserMemory(device_, recv, p->schedule.recvCount * esize);
    }
    // A reduce pipelines its buffer in a few pieces (reduceChunkBytes says why).
    const size_t chunk = args.kind == CollectiveKind::kReduce
                             ? reduceChunkBytes(topology_, args.count * esize,
                                                static_cast<size_t>(chunkBytes_), reducePieceBytes_)
                             : static_cast<size_t>(chunkBytes_);
    const size_t chunkElements = std::max<size_t>(1, chunk / esize);
    p->plan = buildPlan({&p->schedule, send, recv, p->sendRegion.get(), p->recvRegion.get(), esize,
                         chunkElements,
                         std::max<size_t>(1, static_cast<size_t>(config_.slotsPerPeer) / 2)});
    p->plan.messages.front().dtype = args.dtype;
    connectMissingPeers(p->plan, args.kind);
    for (auto& q : p->plan.links) {
      Link* link = links_[q.peer];
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
  // One clock read at each end serves the run's deadline, the links' busy time and the call's
  // duration in the metrics (a read is ~25 ns; a 2-rank 8 B allreduce made seven). A rank
  // alone waits for nothing: no deadline, and its ~100 ns call is timed by the cycle counter
  // (common/cycle_clock.h).
  const bool alone = nranks_ == 1;
  const uint64_t startTicks = alone ? cycle::now() : 0;
  uint64_t startNs = alone ? 0 : nowNs();
  const uint32_t id = collectiveId_++;
  stats_ = {};
  if (deferredAbort_ != nullptr) [[unlikely]]
    raiseDeferredAbort(args.kind, id);
  if (takesSmallExchange(args)) {
    runSmall(args, id, startNs);
    ++completedCollectives_;
    return;
  }
  Prepared& p = prepare(args);
  // A device that pins registered pages (verbs) must not keep registrations of the caller's
  // buffers beyond this call: freed and reallocated memory at the same address would be other
  // pages. Plans for such devices are rebuilt per call, except those inside buffers the caller
  // registered (gs_comm_register: it promises to keep them until it deregisters).
  struct ForgetIfPinned {
    Engine& engine;
    const Prepared* prepared;
    ~ForgetIfPinned() {
      if (engine.registrationPinsMemory_ && !engine.keptByUser(*prepared))
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
  if (p.schedule.steps.empty()) {
    if (alone) {
      const uint64_t endTicks = cycle::now();
      stats_.elapsedNs = endTicks > startTicks ? cycle::ticksToNs(endTicks - startTicks) : 0;
    } else {
      stats_.elapsedNs = elapsedNs(startNs, nowNs());
    }
    ++completedCollectives_;
    return;
  }
  if (alone)
    startNs = nowNs();  // not expected: a lone rank's schedules have no steps

  for (auto& lr : p.links) {
    lr.sendBase = lr.link->sendSequence;
    lr.recvBase = lr.link->recvSequence;
    lr.posted = lr.completed = lr.processed = lr.releasedHere = 0;
    lr.creditBlockedSince = lr.logicalBytesSent = 0;
    const int peer = lr.link->peer();
    lr.codec = p.adaptive && static_cast<size_t>(peer) < linkCodecs_.size() ? linkCodecs_[peer]
                                                                            : args.codec;
    std::fill(lr.sendDone.begin(), lr.sendDone.end(), 0);
    lr.awaitingRead.clear();
    lr.awaitingReadHead = 0;
    for (RecvOp& op : lr.queues->recvs) {
      op.processed = false;
      op.forwardsDone = 0;
      op.inDst = false;
    }
  }
  stats_.adaptive = p.adaptive;
  Run run(*this, args, id, p.plan, p.links);
  run.execute(startNs);
  const uint64_t endNs = nowNs();
  stats_.elapsedNs = elapsedNs(startNs, endNs);
  Run::finishLinks(p.links, startNs, endNs);
  ++completedCollectives_;
}

void Engine::Run::finishLinks(std::vector<LinkRun>& links, uint64_t startNs, uint64_t endNs) {
  constexpr uint64_t kGoodputPeriodNs = 100'000'000;
  for (auto& lr : links) {
    Link& link = *lr.link;
    link.goodputBytes += lr.logicalBytesSent;
    link.goodputBusyNs += elapsedNs(startNs, endNs);
    if (lr.counters != nullptr)
      lr.counters->addBusyTime(elapsedNs(startNs, endNs));
    if (lr.counters != nullptr && elapsedNs(link.goodputPublishedNs, endNs) >= kGoodputPeriodNs &&
        link.goodputBusyNs > 0) {
      lr.counters->setGoodput(static_cast<double>(link.goodputBytes) * 1e9 /
                              static_cast<double>(link.goodputBusyNs));
      link.goodputBytes = link.goodputBusyNs = 0;
      link.goodputPublishedNs = endNs;
    }
  }
  for (auto& lr : links)
    lr.link->recvSequence += lr.queues->recvs.size();
}

// Links served by another device than the primary one (shm peers next to tcp ones) send from
// the user's buffers registered with their own device.
void Engine::registerOnLinkDevices(Prepared& p) {
  for (transport::Device* device : devices_) {
    if (device == &device_)
      continue;
    std::shared_ptr<transport::MemoryRegion> send, recv;
    for (auto& lr : p.links) {
      if (&lr.link->device() != device)
        continue;
      if (!send && p.sendRegion)
        send = registerUserMemory(*device, p.sendRegion->data(), p.sendRegion->size());
      if (!recv && p.recvRegion)
        recv = registerUserMemory(*device, p.recvRegion->data(), p.recvRegion->size());
      for (SendOp& op : lr.queues->sends) {
        if (op.region == p.sendRegion.get())
          op.region = send.get();
        else if (op.region == p.recvRegion.get())
          op.region = recv.get();
      }
    }
    if (send)
      p.otherRegions.push_back({device, std::move(send)});
    if (recv)
      p.otherRegions.push_back({device, std::move(recv)});
  }
}

void Engine::stayHome(Clock::time_point now) {
  if (homeCpuSlot_ < 0 || now < nextHomeCheck_)
    return;
  // A millisecond between looks: a sched_getcpu() and a sched_getaffinity() each; a move (two
  // more system calls) only when the kernel took the thread elsewhere meanwhile.
  constexpr auto kHomeCheckPeriod = std::chrono::milliseconds(1);
  nextHomeCheck_ = now + kHomeCheckPeriod;
  const int home = homeCpuOfCallingThread(homeCpuSlot_);
  if (home >= 0 && sched_getcpu() != home && placeCallingThread(homeCpuSlot_) == -2) {
    GS_LOG_WARN("rank %d: its CPUs changed while it was moved to CPU %d; it stays there", rank_,
                home);
  }
}

void Engine::waitForActivity(std::chrono::microseconds maxWait,
                             std::span<const transport::Connection* const> watched) {
  auto wait = [&](transport::Device& device, std::chrono::microseconds time) {
    if (watched.empty())
      device.waitForActivity(time);
    else
      device.waitForActivityOn(time, watched);
  };
  if (devices_.size() == 1) {
    wait(*devices_.front(), maxWait);
    return;
  }
  // Several devices: none can wake a wait on another, so each waits a short slice in turn.
  const auto slice =
      std::min(maxWait / static_cast<int>(devices_.size()), std::chrono::microseconds(50));
  for (transport::Device* device : devices_)
    wait(*device, slice);
}

}  // namespace gs::stream
