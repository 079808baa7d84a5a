#include "control/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/bytes.h"
#include "common/log.h"
#include "control/bootstrap.h"
#include "control/link_transports.h"
#include "control/net.h"
#include "control/peer_info.h"
#include "control/peer_links.h"

namespace gs::control {

namespace {
// codec=auto: ranks agree on the chunk size every this many adaptive collectives.
constexpr uint64_t kChunkAgreementEvery = 8;
// With shm links and a core per local rank, the engine polls this long before it sleeps.
constexpr std::chrono::microseconds kShmSpinTime{50};
constexpr int64_t kRendezvousGraceMs = 2000;

bool isAutoCodec(const std::string& codec) {
  return codec == "auto" || codec == "AUTO" || codec == "Auto";
}

std::string hostName() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

void Request::complete(Errc code, std::string message) {
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    status_ = code;
    message_ = std::move(message);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  // status_ and message_ no longer change once done_: read them without the lock.
  for (auto& fn : callbacks)
    runCallback(fn);
}

void Request::runCallback(const Callback& fn) const noexcept {
  try {
    fn(status_, message_);
  } catch (const std::exception& e) {
    GS_LOG_ERROR("a request's completion callback threw: %s", e.what());
  } catch (...) {
    GS_LOG_ERROR("a request's completion callback threw");
  }
}

void Request::onComplete(Callback fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  runCallback(fn);
}

bool Request::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool Request::waitUntil(Deadline deadline) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_until(lock, deadline.at(), [&] { return done_; });
}

Errc Request::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

std::string Request::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

Communicator::Communicator(int nranks, int rank, const Config& config)
    : nranks_(nranks), rank_(rank), config_(config) {}

std::unique_ptr<Communicator> Communicator::create(int nranks,
                                                   const UniqueId& id,
                                                   int rank,
                                                   const Config& config) {
  GS_CHECK(nranks >= 1, Errc::kInvalidArgument, "nranks %d must be >= 1", nranks);
  GS_CHECK(rank >= 0 && rank < nranks, Errc::kInvalidArgument, "rank %d out of range [0, %d)", rank,
           nranks);
  config.validate();
  std::unique_ptr<Communicator> comm(new Communicator(nranks, rank, config));
  if (isAutoCodec(config.codec)) {
    parseCodecLadder(config.codecLadder, config.codecFloor);  // fail before connecting
  } else {
    const codecs::CodecSpec spec = codecs::CodecSpec::parse(config.codec);
    if (spec.id != format::CodecId::kRaw)
      comm->codec_ = codecs::makeCodec(spec);
  }
  comm->connect(id);
  return comm;
}

void Communicator::connect(const UniqueId& id) {
  const Deadline deadline = Deadline::afterMs(config_.timeoutMs);
  BootstrapClient bootstrap = BootstrapClient::connect(id, rank_, nranks_, deadline);

  networkTransport_ = transport::resolveTransportName(config_.transport, config_);
  transport::DeviceOptions options;
  options.rank = rank_;
  options.nranks = nranks_;
  options.secret = id.secret;
  // Listen where the other ranks can reach us: GS_SOCKET_IFNAME's address when set, else the
  // local address that reached rank 0 (loopback when rank 0 is on loopback).
  options.bindAddress = config_.socketIfname.empty() ? bootstrap.localAddress()
                                                     : interfaceAddress(config_.socketIfname);
  memcpy(&options.fabricId, id.secret.data(), sizeof(options.fabricId));
  options.config = config_;
  device_ = transport::createDevice(networkTransport_, options);
  shmDevice_ = openShmDevice(networkTransport_, options, shmState_);

  stream::SlotLayout layout;
  layout.slots = static_cast<size_t>(config_.slotsPerPeer);
  layout.chunkBytes = static_cast<size_t>(config_.chunkBytes);
  PeerInfo mine;
  mine.hostname = config_.hostname.empty() ? hostName() : config_.hostname;
  mine.pid = static_cast<int32_t>(getpid());
  mine.transport = networkTransport_;
  mine.chunkBytes = config_.chunkBytes;
  mine.slots = config_.slotsPerPeer;
  mine.codec = config_.codec;
  mine.address = device_->address();
  if (shmDevice_)
    mine.shmAddress = shmDevice_->address();

  // The rendezvous server owns the timeout (it names the ranks that never arrived); wait a
  // little longer than it so its verdict, not our own deadline, is what the caller sees.
  auto records = bootstrap.allgather(mine.serialize(),
                                     Deadline::afterMs(config_.timeoutMs + kRendezvousGraceMs));
  GS_CHECK(records.size() == static_cast<size_t>(nranks_), Errc::kRemote,
           "rendezvous returned %zu records for %d ranks", records.size(), nranks_);
  std::vector<PeerInfo> infos(nranks_);
  std::vector<std::string> hostnames(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    infos[r] = PeerInfo::parse(records[r], r);
    checkCompatible(mine, infos[r], rank_, r);
    hostnames[r] = infos[r].hostname;
  }
  // Peers are known only now (the hierarchical schedule's depend on the hosts): links are made
  // after the rendezvous and swap their slot keys over their own connections.
  topology_ = stream::Topology::fromHostNames(hostnames);
  algorithms_ = allowedAlgorithms(config_.algo, topology_);
  if (config_.algo == "hierarchical" && !topology_.uniform()) {
    GS_LOG_WARN(
        "GS_ALGO=hierarchical needs the same number of ranks on every host (%d ranks, "
        "%d hosts): using ring",
        nranks_, topology_.hosts());
    algorithms_ = {stream::Algorithm::kRing};
  }
  const std::set<int> neighbours = schedulePeers(rank_, topology_, algorithms_);
  std::vector<TransportEndpoint> transports(nranks_);
  for (int r = 0; r < nranks_; ++r)
    transports[r] = {infos[r].hostname, infos[r].shmAddress};
  std::vector<PeerEndpoint> endpoints;
  std::vector<std::string> linkTransport(nranks_);  // by peer: what carries its link
  int shmLinks = 0, localOverNetwork = 0;
  for (int p : neighbours) {
    if (shmDevice_ && shmBetween(transports[rank_], transports[p])) {
      endpoints.push_back({p, shmDevice_.get(), infos[p].shmAddress});
      linkTransport[p] = "shm";
      ++shmLinks;
    } else {
      endpoints.push_back({p, device_.get(), infos[p].address});
      linkTransport[p] = networkTransport_;
      localOverNetwork += infos[p].hostname == infos[rank_].hostname ? 1 : 0;
    }
  }
  const int networkLinks = static_cast<int>(neighbours.size()) - shmLinks;
  transportName_ = linkTransportsName(networkTransport_, shmLinks, networkLinks);
  if (shmState_ == ShmState::kUnused && shmLinks > 0)
    shmState_ = ShmState::kInUse;
  if (shmLinks == 0)
    shmDevice_.reset();  // no peer chose it either (the choice is symmetric): free its segment
  logLinkTransports(shmLinks, networkLinks, localOverNetwork);
  links_ = connectPeerLinks(nranks_, endpoints, layout, deadline);
  // Every rank computes both from all records: the algorithm choice must agree everywhere.
  costModel_.intraHost =
      stream::CostModel::measured(shmWithinHosts(transports) ? "shm" : networkTransport_);
  costModel_.interHost = stream::CostModel::measured(networkTransport_);
  costModel_.chunkBytes = static_cast<double>(config_.chunkBytes);
  // Wire bytes per logical byte of a full fp32 chunk (an upper bound for top-k).
  costModel_.codecRatio =
      codec_ ? static_cast<double>(codec_->maxEncodedBytes(DataType::kFloat32, 1 << 18)) /
                   static_cast<double>(1 << 20)
             : 1.0;
  // Ranks on one host (same hostname) get consecutive local ranks: the metrics port offset.
  int localRank = 0;
  for (int r = 0; r < rank_; ++r)
    localRank += infos[r].hostname == mine.hostname ? 1 : 0;
  metrics_ =
      std::make_unique<monitoring::Metrics>(config_, rank_, nranks_, localRank, transportName_);
  std::vector<monitoring::LinkCounters*> counters(nranks_, nullptr);
  for (int p : neighbours) {
    counters[p] = &metrics_->addLink(p, linkTransport[p]);
    counters[p]->setChunkSize(static_cast<uint64_t>(config_.chunkBytes));
    counters[p]->setCodecRung(codec_ ? static_cast<int>(codec_->id()) : 0);
  }
  metrics_->setTransportInfo({{"device", networkTransport_},
                              {"port", options.bindAddress},
                              {"gid_index", "none"},
                              {"memory_path", "host"},
                              {"shm", shmStateName(shmState_)}});

  std::vector<stream::Link*> raw(nranks_, nullptr);
  for (int p = 0; p < nranks_; ++p)
    raw[p] = links_[p].get();
  // The engine registers the caller's buffers with its primary device first: make that one
  // that serves links (a verbs device serving none would pin pages for nothing).
  transport::Device& primary = networkLinks == 0 && shmLinks > 0 ? *shmDevice_ : *device_;
  engine_ = std::make_unique<stream::Engine>(rank_, nranks_, primary, raw, config_, aborted_);
  engine_->setLinkCounters(std::move(counters));
  engine_->setTopology(topology_);
  if (isAutoCodec(config_.codec)) {
    controller_ = std::make_unique<AdaptiveController>(
        config_, std::vector<int>(neighbours.begin(), neighbours.end()));
    controller_->apply(*engine_, *metrics_);
  }
  int localRanks = 0;
  for (const PeerInfo& info : infos)
    localRanks += info.hostname == mine.hostname ? 1 : 0;
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores > 0 && localRanks > cores) {
    engine_->setSpinRounds(0);
    GS_LOG_INFO("%d ranks share %d cores on this host: waiting without busy polling", localRanks,
                cores);
  } else if (shmLinks > 0) {
    engine_->setSpinTime(kShmSpinTime);
  }
  if (!metrics_->exporterAddress().empty()) {
    GS_LOG_INFO("rank %d serves Prometheus metrics at http://%s/metrics", rank_,
                metrics_->exporterAddress().c_str());
  }
  GS_LOG_INFO(
      "communicator ready: rank %d of %d on host %d of %d, transport %s on %s, %zu peers, "
      "chunk %lld B x %lld slots, GS_ALGO=%s",
      rank_, nranks_, topology_.hostOf[rank_], topology_.hosts(), transportName_.c_str(),
      options.bindAddress.c_str(), neighbours.size(), static_cast<long long>(config_.chunkBytes),
      static_cast<long long>(config_.slotsPerPeer), config_.algo.c_str());
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    stopping_ = true;
  }
  queueCv_.notify_all();
  if (worker_.joinable())
    worker_.join();
  std::lock_guard<std::mutex> lock(execMutex_);
  bool healthy = !aborted_.load();
  {
    std::lock_guard<std::mutex> state(stateMutex_);
    healthy = healthy && !failure_;
  }
  if (engine_ && healthy)
    engine_->farewell(Deadline::afterMs(std::min<int64_t>(config_.timeoutMs, 10000)));
}

void Communicator::logLinkTransports(int shmLinks, int networkLinks, int localOverNetwork) const {
  // Nothing to say when shm was not considered and no peer shares the host, or for loopback
  // (threads of one process: every peer is local and none needs shm).
  if ((shmState_ == ShmState::kOff && localOverNetwork == 0) || networkTransport_ == "loopback")
    return;
  std::string why;
  if (localOverNetwork > 0) {
    why = formatString(" (%d of them on this host: shm %s)", localOverNetwork,
                       shmState_ == ShmState::kOff           ? "is off here"
                       : shmState_ == ShmState::kUnavailable ? "is unavailable here"
                                                             : "is not usable with them");
  }
  GS_LOG_INFO("rank %d: shm to %d local peer%s, %s to %d peer%s%s", rank_, shmLinks,
              shmLinks == 1 ? "" : "s", networkTransport_.c_str(), networkLinks,
              networkLinks == 1 ? "" : "s", why.c_str());
}

void Communicator::checkUsable() const {
  GS_CHECK(!aborted_.load(), Errc::kAborted, "communicator (rank %d) was aborted", rank_);
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (failure_) {
    throw Error(failure_->code(), std::string("communicator failed earlier: ") + failure_->what());
  }
}

void Communicator::execute(const stream::CollectiveArgs& args, bool record) {
  std::lock_guard<std::mutex> lock(execMutex_);
  checkUsable();
  try {
    stream::CollectiveArgs withCodec = args;
    // Integer buffers (and any dtype the codec cannot take) travel raw, exactly. A codec of the
    // call's own (a gradient stream's) stands.
    if (withCodec.codec == nullptr && codec_ && codec_->supports(args.dtype))
      withCodec.codec = codec_.get();
    // codec=auto: floating-point buffers with no codec of their own follow the controller.
    withCodec.adaptive = controller_ != nullptr && withCodec.codec == nullptr &&
                         codecs::residualElementSize(args.dtype) > 0;
    if (withCodec.adaptive && ++adaptiveCalls_ % kChunkAgreementEvery == 0)
      agreeOnChunkSize();
    if (withCodec.adaptive)
      controller_->begin(*metrics_);
    if (args.kind == stream::CollectiveKind::kAllReduce)
      withCodec.algorithm = chooseAlgorithm(withCodec);
    metrics_->beginCollective();
    const auto start = Clock::now();
    engine_->run(withCodec);
    if (engine_->lastStats().adaptive) {
      std::vector<stream::Link*> byPeer(links_.size(), nullptr);
      for (size_t p = 0; p < links_.size(); ++p)
        byPeer[p] = links_[p].get();
      controller_->end(*engine_, *metrics_, byPeer, AdaptiveController::Clock::now());
    }
    if (record)
      recordCollective(args, std::chrono::duration<double>(Clock::now() - start).count());
  } catch (const Error& e) {
    fail(e);
    throw;
  }
}

void Communicator::fail(const Error& e) {
  {
    std::lock_guard<std::mutex> state(stateMutex_);
    if (failure_)
      return;  // already counted (a staged call's piece failed in execute)
    failure_ = e;
  }
  metrics_->recordError(e.code());
}

void Communicator::setDeviceMemory(std::shared_ptr<codecs::DeviceMemory> memory) {
  std::lock_guard<std::mutex> lock(deviceMemoryMutex_);
  deviceMemory_ = std::move(memory);
  deviceMemoryResolved_ = true;
}

codecs::DeviceMemory* Communicator::deviceMemory() {
  std::lock_guard<std::mutex> lock(deviceMemoryMutex_);
  if (!deviceMemoryResolved_) {
    deviceMemoryResolved_ = true;
    try {
      deviceMemory_ = codecs::makeCudaDeviceMemory();
    } catch (const Error& e) {
      deviceMemoryUnavailable_ = e.what();
    }
  }
  return deviceMemory_.get();
}

void Communicator::checkStreamUsable(const codecs::DeviceMemory* memory) const {
  GS_CHECK(memory != nullptr, Errc::kUnsupported, "cuda_stream is not NULL, but %s",
           deviceMemoryUnavailable_.c_str());
}

int Communicator::bufferDevice(const void* p) {
  codecs::DeviceMemory* memory = deviceMemory();
  return memory != nullptr ? memory->deviceOf(p) : -1;
}

void Communicator::runStaged(const stream::CollectiveArgs& args,
                             CUstream_st* cudaStream,
                             const StreamMark* issued) {
  codecs::DeviceMemory* memory = deviceMemory();
  const int device = memory != nullptr ? collectiveDevice(*memory, args) : -1;
  if (device < 0 && cudaStream == nullptr && issued == nullptr)
    return runHost(args);
  checkStreamUsable(memory);
  if (!staging_) {
    staging_ = std::make_unique<DeviceStaging>(deviceMemory_, config_.stagingBytes,
                                               config_.timeoutMs, aborted_);
  }
  try {
    if (device < 0) {
      // Host buffers: after the stream's producers (those enqueued before this call, or before
      // the request was issued).
      if (issued == nullptr)
        staging_->waitFor(StreamMark(deviceMemory_, cudaStream, -1));
      else
        staging_->waitFor(*issued);
      return runHost(args);
    }
    if (!stagingLogged_) {
      stagingLogged_ = true;
      GS_LOG_INFO(
          "rank %d: CUDA device buffers (device %d) go through pinned host staging: 2 x %lld "
          "bytes, copies on %s stream, reduction on the host over %s%s",
          rank_, device, static_cast<long long>(config_.stagingBytes),
          issued != nullptr ? "the communicator's own" : "the caller's", transportName_.c_str(),
          networkTransport_ == "verbs" ? " (the NIC does not touch GPU memory in this version)"
                                       : "");
    }
    const auto start = Clock::now();
    auto runHost = [&](const stream::CollectiveArgs& piece) { execute(piece, false); };
    const DeviceStaging::Totals totals =
        issued != nullptr ? staging_->runIssued(args, rank_, nranks_, *issued, runHost)
                          : staging_->run(args, rank_, nranks_, device, cudaStream, runHost);
    metrics_->recordStaged(totals.toHostBytes, totals.toDeviceBytes);
    recordCollective(args, std::chrono::duration<double>(Clock::now() - start).count());
  } catch (const Error& e) {
    // The peers are in (or about to enter) this collective: a rank that cannot take part
    // leaves the communicator broken, as a failed engine run does. A bad argument (a stream of
    // another device) is refused before anything was staged, as the C API's checks are.
    if (e.code() != Errc::kInvalidArgument) {
      fail(e);
      std::lock_guard<std::mutex> lock(execMutex_);
      engine_->notifyPeers(e.code(), e.what());  // once per engine: a no-op after a run did
    }
    throw;
  }
}

void Communicator::runHost(const stream::CollectiveArgs& args) {
  if (args.residual != nullptr) {
    GS_CHECK(args.kind == stream::CollectiveKind::kAllReduce && args.send == args.recv,
             Errc::kInvalidArgument, "error feedback (a residual) needs an in-place allreduce");
    const size_t rsize = codecs::residualElementSize(args.dtype);
    codecs::applyResidual(args.dtype, args.recv, args.residual, args.count);
    memset(args.residual, 0, args.count * rsize);
  }
  execute(args);
}

void Communicator::agreeOnChunkSize() {
  // Proposals above the slot size (or none yet) count as the slot size: chunks cannot grow
  // beyond what a receive slot holds.
  const int64_t slot = config_.chunkBytes;
  const int64_t proposal = controller_->proposedChunkBytes();
  int64_t mine = proposal > 0 ? std::min(proposal, slot) : slot;
  int64_t agreed = 0;
  stream::CollectiveArgs a;
  a.kind = stream::CollectiveKind::kAllReduce;
  a.send = &mine;
  a.recv = &agreed;
  a.count = 1;
  a.dtype = DataType::kInt64;
  a.op = ReduceOp::kMin;
  engine_->run(a);
  agreed = std::max<int64_t>(agreed, 4096);
  if (agreed != engine_->chunkBytes()) {
    GS_LOG_INFO("rank %d: chunk size %lld -> %lld bytes (agreed by all ranks)", rank_,
                static_cast<long long>(engine_->chunkBytes()), static_cast<long long>(agreed));
    engine_->setChunkBytes(agreed);
  }
}

stream::Algorithm Communicator::chooseAlgorithm(const stream::CollectiveArgs& args) {
  // Error feedback's accounting is the ring's (see CollectiveArgs::residual).
  if (args.residual != nullptr || algorithms_.size() == 1)
    return args.residual != nullptr ? stream::Algorithm::kRing : algorithms_.front();
  stream::CostModel model = costModel_;
  if (args.codec == nullptr)
    model.codecRatio = 1.0;
  const double bytes = static_cast<double>(args.count * elementSize(args.dtype));
  stream::Algorithm best = stream::Algorithm::kRing;
  double bestTime = 0;
  bool considered = false;
  for (stream::Algorithm a : algorithms_) {
    // codec=auto compresses because the network is the bottleneck, and only the ring and the
    // tree carry a codec on every hop (halving-doubling's doubling and hierarchical's host
    // steps travel raw). The rungs in use differ per rank, so they cannot enter a choice that
    // every rank must make alike; args.adaptive is the same everywhere.
    if (args.adaptive && a != stream::Algorithm::kRing && a != stream::Algorithm::kTree)
      continue;
    const double t = stream::predictAllReduceSeconds(a, topology_, bytes, model);
    if (!considered || t < bestTime) {
      best = a;
      bestTime = t;
      considered = true;
    }
  }
  if (best != lastChoice_) {
    GS_LOG_INFO("allreduce of %.0f bytes on %d ranks (%d hosts): algorithm %s (predicted %.1f us)",
                bytes, nranks_, topology_.hosts(), stream::algorithmName(best), bestTime * 1e6);
    lastChoice_ = best;
  }
  return best;
}

// nccl-tests conventions: size is the larger buffer; busbw scales algbw by the data each link
// must carry in an optimal algorithm.
void Communicator::recordCollective(const stream::CollectiveArgs& args, double seconds) {
  const double n = nranks_;
  double bytes = static_cast<double>(args.count * elementSize(args.dtype)), factor = 1;
  switch (args.kind) {
    case stream::CollectiveKind::kAllReduce:
      factor = 2 * (n - 1) / n;
      break;
    case stream::CollectiveKind::kReduceScatter:
    case stream::CollectiveKind::kAllGather:
      bytes *= n;
      factor = (n - 1) / n;
      break;
    case stream::CollectiveKind::kBroadcast:
      break;
  }
  const double algbw = seconds > 0 ? bytes / seconds : 0;
  metrics_->recordCollective(static_cast<monitoring::CollectiveOp>(args.kind),
                             engine_->lastAlgorithm(), seconds, static_cast<uint64_t>(bytes), algbw,
                             algbw * factor);
  std::lock_guard<std::mutex> lock(stateMutex_);
  lastSeconds_ = seconds;
  lastAlgbw_ = algbw;
  lastBusbw_ = algbw * factor;
  lastAlgorithmName_ = engine_->lastAlgorithm();
}

Communicator::Stats Communicator::stats() const {
  Stats out;
  out.snapshot = metrics_->snapshot();
  out.metricsAddress = metrics_->exporterAddress();
  std::lock_guard<std::mutex> lock(stateMutex_);
  out.lastSeconds = lastSeconds_;
  out.lastAlgbw = lastAlgbw_;
  out.lastBusbw = lastBusbw_;
  out.lastAlgorithm = lastAlgorithmName_;
  return out;
}

void Communicator::run(const stream::CollectiveArgs& args, CUstream_st* cudaStream) {
  checkUsable();
  std::unique_lock<std::mutex> lock(queueMutex_);
  // Earlier non-blocking requests go first (issue order). Each is bounded by the timeout.
  queueCv_.wait(lock,
                [&] { return (queue_.empty() && !workerBusy_ && !inlineBusy_) || stopping_; });
  inlineBusy_ = true;
  lock.unlock();
  struct Release {
    Communicator* self;
    ~Release() {
      {
        std::lock_guard<std::mutex> l(self->queueMutex_);
        self->inlineBusy_ = false;
      }
      self->queueCv_.notify_all();
    }
  } release{this};
  runStaged(args, cudaStream);
}

std::shared_ptr<Request> Communicator::submit(const stream::CollectiveArgs& args,
                                              CUstream_st* cudaStream) {
  checkUsable();
  std::unique_ptr<StreamMark> issued;
  codecs::DeviceMemory* memory = deviceMemory();
  const int device = memory != nullptr ? collectiveDevice(*memory, args) : -1;
  if (device >= 0 || cudaStream != nullptr) {
    checkStreamUsable(memory);
    issued = std::make_unique<StreamMark>(deviceMemory_, cudaStream, device);
  }
  auto request = std::make_shared<Request>(args, std::move(issued));
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    if (!worker_.joinable())
      worker_ = std::thread([this] { progressLoop(); });
    queue_.push_back(request);
  }
  queueCv_.notify_all();
  return request;
}

void Communicator::progressLoop() {
  setLogRank(rank_);
  std::unique_lock<std::mutex> lock(queueMutex_);
  for (;;) {
    queueCv_.wait(lock, [&] { return (!queue_.empty() && !inlineBusy_) || stopping_; });
    if (queue_.empty())
      return;  // stopping with nothing left
    auto request = queue_.front();
    queue_.pop_front();
    workerBusy_ = true;
    lock.unlock();
    try {
      runStaged(request->args(), nullptr, request->issued());
      request->complete(Errc::kOk, "");
    } catch (const Error& e) {
      request->complete(e.code(), e.what());
    } catch (const std::exception& e) {
      request->complete(Errc::kInternal, e.what());
    }
    lock.lock();
    workerBusy_ = false;
    queueCv_.notify_all();
  }
}

void Communicator::abort() {
  aborted_.store(true);
  if (device_)
    device_->interrupt();
  if (shmDevice_)
    shmDevice_->interrupt();
  // When no collective is running, tell the peers here; otherwise the running one does.
  std::unique_lock<std::mutex> lock(execMutex_, std::try_to_lock);
  if (lock.owns_lock() && engine_)
    engine_->notifyPeers(Errc::kAborted, "communicator aborted");
  GS_LOG_WARN("communicator rank %d of %d aborted", rank_, nranks_);
}

}  // namespace gs::control
