// Joining a communicator: Communicator::create and the steps of Communicator::connect, in the
// order they run. Every choice that both ranks of a pair (or all ranks) must make alike is
// computed from the all-gathered rendezvous records, never from local state alone.

#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_placement.h"
#include "common/log.h"
#include "control/bootstrap.h"
#include "control/communicator.h"
#include "control/link_transports.h"
#include "control/net.h"
#include "control/peer_info.h"
#include "control/peer_links.h"

namespace gs::control {

namespace {
// With shm links and a core per local rank, the engine polls this long before it sleeps.
constexpr std::chrono::microseconds kShmSpinTime{50};
// Where ranks outnumber cores, calls up to this size poll (yielding) before they sleep.
constexpr size_t kYieldingMaxBytes = 64 << 10;
// The rendezvous server owns the timeout (it names the ranks that never arrived); a rank waits
// this much longer than it so the server's verdict, not its own deadline, is what callers see.
constexpr int64_t kRendezvousGraceMs = 2000;

bool isAutoCodec(const std::string& codec) {
  return codec == "auto" || codec == "AUTO" || codec == "Auto";
}

std::string hostName() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

/// This rank's rendezvous record: who it is, the settings every rank must share, and the
/// address blobs of its devices.
PeerInfo ownRecord(const Config& config,
                   const std::string& networkTransport,
                   const transport::Device& device,
                   const transport::Device* shmDevice) {
  PeerInfo mine;
  mine.hostname = config.hostname.empty() ? hostName() : config.hostname;
  mine.pid = static_cast<int32_t>(getpid());
  mine.transport = networkTransport;
  mine.chunkBytes = config.chunkBytes;
  mine.slots = config.slotsPerPeer;
  mine.codec = config.codec;
  mine.shmSmallBytes = config.shmSmallBytes;
  mine.algo = config.algo;
  mine.algoTune = config.algoTune;
  mine.address = device.address();
  if (shmDevice) {
    mine.shmAddress = shmDevice->address();
    mine.shmFreeBytes = sharedMemoryFreeBytes();
  }
  mine.cpuMask = callingThreadCpuMask();
  return mine;
}

/// Publishes `mine` through the rendezvous and returns every rank's record, parsed and checked.
std::vector<PeerInfo> exchangeRecords(BootstrapClient& bootstrap,
                                      const PeerInfo& mine,
                                      const Config& config) {
  const auto records = bootstrap.allgather(
      mine.serialize(), Deadline::afterMs(config.timeoutMs + kRendezvousGraceMs));
  GS_CHECK(records.size() == static_cast<size_t>(bootstrap.nranks()), Errc::kRemote,
           "rendezvous returned %zu records for %d ranks", records.size(), bootstrap.nranks());
  return parseRecords(records, mine, bootstrap.rank());
}

std::vector<TransportEndpoint> transportEndpoints(const std::vector<PeerInfo>& infos) {
  std::vector<TransportEndpoint> out;
  out.reserve(infos.size());
  for (const PeerInfo& info : infos)
    out.push_back({info.hostname, info.shmAddress});
  return out;
}

/// How many of the ranks below `end` run on `host`.
int ranksOnHost(const std::vector<PeerInfo>& infos, const std::string& host, size_t end) {
  int n = 0;
  for (size_t r = 0; r < end; ++r)
    n += infos[r].hostname == host ? 1 : 0;
  return n;
}

}  // namespace

/// Which device carries the link to each peer of this rank's schedules.
struct Communicator::LinkPlan {
  std::set<int> peers;                   // every peer of a schedule this rank may run
  std::vector<PeerEndpoint> endpoints;   // one per peer, ascending
  std::vector<std::string> transportOf;  // by rank: what carries its link ("" for no link)
  int shmLinks = 0, networkLinks = 0;
  int localOverNetwork = 0;  // same-host peers the network transport serves
};

std::unique_ptr<Communicator> Communicator::create(int nranks,
                                                   const UniqueId& id,
                                                   int rank,
                                                   const Config& config) {
  std::unique_ptr<Communicator> comm = unconnected(nranks, rank, config);
  comm->connect(id);
  return comm;
}

std::unique_ptr<Communicator> Communicator::unconnected(int nranks,
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
  return comm;
}

void Communicator::connect(const UniqueId& id) {
  const Deadline deadline = Deadline::afterMs(config_.timeoutMs);
  BootstrapClient bootstrap = BootstrapClient::connect(id, rank_, nranks_, deadline);
  openDevices(id.secret, bootstrap.localAddress());
  join(deadline, exchangeRecords(bootstrap, ownRecord(), config_));
}

PeerInfo Communicator::ownRecord() const {
  return control::ownRecord(config_, networkTransport_, *device_, shmDevice_.get());
}

void Communicator::join(Deadline deadline, const std::vector<PeerInfo>& infos, Links links) {
  // Peers are known only now (the hierarchical schedule's depend on the hosts): links are made
  // after the rendezvous and swap their slot keys over their own connections.
  transports_ = transportEndpoints(infos);
  std::set<int> peers = chooseSchedules(infos);
  leaveShmWhereSlotsDoNotFit(infos, peers);
  pipelineChunk_ = pipelineChunkBytes(networkTransport_, transports_, config_.chunkBytes);
  for (const PeerInfo& info : infos)
    networkAddresses_.push_back(info.address);
  const LinkPlan plan = planLinks(infos, std::move(peers));
  if (links == Links::kNow) {
    links_ = connectPeerLinks(nranks_, plan.endpoints, slotLayout(), deadline);
  } else {
    // Every rank of a call makes the links it needs at that call (linkLater), as for the peers
    // only some schedules name; everything else here is planned for the links as if made.
    links_.resize(static_cast<size_t>(nranks_));
  }
  setUpCostModel(infos);
  startEngine(infos, plan, startMetrics(infos, plan, bindAddress_));
  logReady(plan, bindAddress_);
}

transport::DeviceOptions Communicator::openDevices(const Secret& secret,
                                                   const std::string& addressReachingRank0) {
  networkTransport_ = transport::resolveTransportName(config_.transport, config_);
  transport::DeviceOptions options;
  options.rank = rank_;
  options.nranks = nranks_;
  options.secret = secret;
  // Listen where the other ranks can reach us: GS_SOCKET_IFNAME's address when set, else the
  // local address that reached rank 0 (loopback when rank 0 is on loopback).
  options.bindAddress =
      config_.socketIfname.empty() ? addressReachingRank0 : interfaceAddress(config_.socketIfname);
  bindAddress_ = options.bindAddress;
  memcpy(&options.fabricId, secret.data(), sizeof(options.fabricId));
  options.config = config_;
  device_ = transport::createDevice(networkTransport_, options);
  shmDevice_ = openShmDevice(networkTransport_, options, shmState_);
  return options;
}

std::set<int> Communicator::chooseSchedules(const std::vector<PeerInfo>& infos) {
  std::vector<std::string> hostnames(nranks_);
  for (int r = 0; r < nranks_; ++r)
    hostnames[r] = infos[r].hostname;
  topology_ = stream::Topology::fromHostNames(hostnames);
  // The cores each host's ranks share, for the cost model (ranks outnumbering cores): from
  // every rank's record, so every rank prices the schedules alike.
  topology_.coresOf.assign(static_cast<size_t>(topology_.hosts()), 0);
  for (int h = 0; h < topology_.hosts(); ++h) {
    std::vector<std::vector<uint8_t>> masks;
    for (int r : topology_.ranksOn(h)) {
      if (infos[r].cpuMask.empty()) {
        masks.clear();  // a rank that could not tell: the host's cores are unknown
        break;
      }
      masks.push_back(infos[r].cpuMask);
    }
    topology_.coresOf[h] = cpusInUnion(masks);
  }
  algorithms_ = allowedAlgorithms(config_.algo, topology_);
  stream::ReduceAlgorithm reduce;
  if (stream::parseReduceAlgorithm(config_.reduceAlgo, &reduce))  // else "auto" (Config checks)
    fixedReduce_ = reduce;
  if (config_.algo == "hierarchical" && !topology_.uniform()) {
    GS_LOG_WARN(
        "GS_ALGO=hierarchical needs the same number of ranks on every host (%d ranks, "
        "%d hosts): using ring",
        nranks_, topology_.hosts());
    algorithms_ = {stream::Algorithm::kRing};
  }
  return schedulePeers(rank_, topology_, algorithms_);
}

void Communicator::leaveShmWhereSlotsDoNotFit(const std::vector<PeerInfo>& infos,
                                              const std::set<int>& myPeers) {
  std::vector<int64_t> room(nranks_);
  for (int r = 0; r < nranks_; ++r)
    room[r] = infos[r].shmFreeBytes;
  const auto peersOf = [&](int r) {
    return r == rank_ ? myPeers : schedulePeers(r, topology_, algorithms_);
  };
  // Each end's receive slots, plus the connection's queues and mailboxes (under 512 KiB).
  const int64_t bytesPerLink = static_cast<int64_t>(slotLayout().regionBytes()) + (512 << 10);
  for (const ShmShortfall& h :
       dropShmWhereSlotsDoNotFit(transports_, room, peersOf, bytesPerLink)) {
    if (h.hostname != infos[rank_].hostname)
      continue;
    shmState_ = shmState_ == ShmState::kOff ? shmState_ : ShmState::kUnavailable;
    GS_LOG_WARN(
        "rank %d: the shm links of host %s need %.0f MB of /dev/shm, %.0f MB are free: its ranks "
        "use %s instead (give /dev/shm more room, e.g. a container's --shm-size, or fewer or "
        "smaller slots: GS_SLOTS_PER_PEER, GS_CHUNK_BYTES)",
        rank_, h.hostname.c_str(), h.needBytes / 1e6, h.freeBytes / 1e6, networkTransport_.c_str());
  }
}

Communicator::LinkPlan Communicator::planLinks(const std::vector<PeerInfo>& infos,
                                               std::set<int> peers) {
  LinkPlan plan;
  plan.peers = std::move(peers);
  plan.transportOf.resize(nranks_);
  for (int p : plan.peers) {
    plan.endpoints.push_back(endpointFor(p, &plan.transportOf[p]));
    if (plan.transportOf[p] == "shm")
      ++plan.shmLinks;
    else
      plan.localOverNetwork += infos[p].hostname == infos[rank_].hostname ? 1 : 0;
  }
  plan.networkLinks = static_cast<int>(plan.peers.size()) - plan.shmLinks;
  transportName_ = linkTransportsName(networkTransport_, plan.shmLinks, plan.networkLinks);
  if (shmState_ == ShmState::kUnused && plan.shmLinks > 0)
    shmState_ = ShmState::kInUse;
  // No rank it could ever share memory with (a link made later, linkLater, to a same-host peer
  // would): free its segment. The test is symmetric, so such a peer frees its device too.
  bool shmPossible = false;
  for (int p = 0; p < nranks_ && shmDevice_ && !shmPossible; ++p)
    shmPossible = p != rank_ && shmBetween(transports_[rank_], transports_[p]);
  if (!shmPossible)
    shmDevice_.reset();
  logLinkTransports(plan.shmLinks, plan.networkLinks, plan.localOverNetwork);
  return plan;
}

PeerEndpoint Communicator::endpointFor(int peer, std::string* transport) const {
  if (shmDevice_ && shmBetween(transports_[rank_], transports_[peer])) {
    *transport = "shm";
    return {peer, shmDevice_.get(), transports_[peer].shmAddress};
  }
  *transport = networkTransport_;
  return {peer, device_.get(), networkAddresses_[peer]};
}

stream::SlotLayout Communicator::slotLayout() const {
  stream::SlotLayout layout;
  layout.slots = static_cast<size_t>(config_.slotsPerPeer);
  layout.chunkBytes = static_cast<size_t>(config_.chunkBytes);
  return layout;
}

void Communicator::linkLater(const std::vector<int>& peers) {
  std::vector<PeerEndpoint> endpoints;
  std::vector<std::string> transportOf(nranks_);
  for (int p : peers)
    endpoints.push_back(endpointFor(p, &transportOf[p]));
  auto made =
      connectPeerLinks(nranks_, endpoints, slotLayout(), Deadline::afterMs(config_.timeoutMs));
  int shm = 0;
  for (int p : peers) {
    links_[p] = std::move(made[p]);
    monitoring::LinkCounters* counters = &metrics_->addLink(p, transportOf[p]);
    counters->setChunkSize(static_cast<uint64_t>(config_.chunkBytes));
    counters->setCodecRung(codec_ ? static_cast<int>(codec_->id()) : 0);
    engine_->addLink(p, links_[p].get(), counters);
    shm += transportOf[p] == "shm" ? 1 : 0;
  }
  if (shm > 0 && shmState_ == ShmState::kUnused)
    shmState_ = ShmState::kInUse;
  GS_LOG_INFO("rank %d: %zu more link%s (%d over shm) for a schedule that needs them", rank_,
              peers.size(), peers.size() == 1 ? "" : "s", shm);
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

void Communicator::setUpCostModel(const std::vector<PeerInfo>& infos) {
  // Every rank computes both from all records: the algorithm choice must agree everywhere.
  costModel_.intraHost = stream::CostModel::measured(
      shmWithinHosts(transportEndpoints(infos)) ? "shm" : networkTransport_);
  costModel_.interHost = stream::CostModel::measured(networkTransport_);
  costModel_.chunkBytes = static_cast<double>(pipelineChunk_);
  costModel_.codecRatio = wireRatio(codec_.get());
}

double Communicator::wireRatio(const codecs::Codec* codec) {
  // Wire bytes per logical byte of a full fp32 chunk (an upper bound for top-k).
  return codec != nullptr
             ? static_cast<double>(codec->maxEncodedBytes(DataType::kFloat32, 1 << 18)) /
                   static_cast<double>(1 << 20)
             : 1.0;
}

std::vector<monitoring::LinkCounters*> Communicator::startMetrics(
    const std::vector<PeerInfo>& infos, const LinkPlan& plan, const std::string& bindAddress) {
  // Ranks on one host (same hostname) get consecutive local ranks: the metrics port offset.
  const int localRank = ranksOnHost(infos, infos[rank_].hostname, static_cast<size_t>(rank_));
  metrics_ =
      std::make_unique<monitoring::Metrics>(config_, rank_, nranks_, localRank, transportName_);
  std::vector<monitoring::LinkCounters*> counters(nranks_, nullptr);
  for (int p : plan.peers) {
    counters[p] = &metrics_->addLink(p, plan.transportOf[p]);
    counters[p]->setChunkSize(static_cast<uint64_t>(pipelineChunk_));
    counters[p]->setCodecRung(codec_ ? static_cast<int>(codec_->id()) : 0);
  }
  metrics_->setTransportInfo({{"device", networkTransport_},
                              {"port", bindAddress},
                              {"gid_index", "none"},
                              {"memory_path", "host"},
                              {"shm", shmStateName(shmState_)}});
  return counters;
}

void Communicator::startEngine(const std::vector<PeerInfo>& infos,
                               const LinkPlan& plan,
                               std::vector<monitoring::LinkCounters*> counters) {
  std::vector<stream::Link*> raw(nranks_, nullptr);
  for (int p = 0; p < nranks_; ++p)
    raw[p] = links_[p].get();
  // The engine registers the caller's buffers with its primary device first: make that one
  // that serves links (a verbs device serving none would pin pages for nothing).
  transport::Device& primary = plan.networkLinks == 0 && plan.shmLinks > 0 ? *shmDevice_ : *device_;
  engine_ = std::make_unique<stream::Engine>(rank_, nranks_, primary, raw, config_, aborted_);
  engine_->setLinkCounters(std::move(counters));
  engine_->setTopology(topology_);
  engine_->setLinkMaker([this](const std::vector<int>& peers) { linkLater(peers); });
  engine_->setChunkBytes(pipelineChunk_);
  // A reduce's pieces suit its slowest link, as the cost model prices it.
  engine_->setReducePieceBytes(static_cast<size_t>(
      (topology_.hosts() > 1 ? costModel_.interHost : costModel_.intraHost).reducePieceBytes));
  // Small all-to-all, allgather and reduce-scatter calls of more than two ranks may swap blocks
  // through the shm mailboxes of every pair: only where every pair shares memory (every rank
  // computes this alike from the rendezvous records).
  bool everyPairShm = config_.shmSmallBytes > 0;
  for (int a = 0; a < nranks_ && everyPairShm; ++a) {
    for (int b = a + 1; b < nranks_ && everyPairShm; ++b)
      everyPairShm = shmBetween(transports_[a], transports_[b]);
  }
  engine_->setSmallExchangeGroup(everyPairShm);
  if (isAutoCodec(config_.codec)) {
    // Its links start from the communicator's pipeline chunk (pipelineChunkBytes), then
    // propose their own within GS_CHUNK_MIN_BYTES..GS_CHUNK_MAX_BYTES.
    Config start = config_;
    start.chunkBytes = pipelineChunk_;
    controller_ = std::make_unique<AdaptiveController>(
        start, std::vector<int>(plan.peers.begin(), plan.peers.end()));
    controller_->apply(*engine_, *metrics_);
  }
  const int localRanks = ranksOnHost(infos, infos[rank_].hostname, infos.size());
  // The CPUs this host's ranks may use together, as the cost model counts them (ranks pinned
  // one per core are not crowded); the machine's count where a rank could not tell.
  const int host = topology_.hostOf[rank_];
  const int cores = topology_.coresOn(host) > 0
                        ? topology_.coresOn(host)
                        : static_cast<int>(std::thread::hardware_concurrency());
  if (cores > 0 && localRanks > cores) {
    engine_->setSpinRounds(0);
    // Ranks spread evenly over the CPUs rather than where wake-ups left them (common/
    // cpu_placement.h says why): local rank r polls on the (r mod n)-th CPU it may use.
    engine_->setHomeCpuSlot(ranksOnHost(infos, infos[rank_].hostname, static_cast<size_t>(rank_)));
    // Measured on 2 cores, 4 ranks: a single copy of a 256 KiB chunk, which waits for the
    // peer to run, made a 1 MiB allreduce 30 % slower; 1 MiB chunks (all-to-all) still gain.
    engine_->setSingleCopyMinBytes(1 << 20);
    // Small calls still poll, but give the core away at every idle round (sched_yield, as
    // OpenMPI's oversubscribed progress does): the rank this one waits for is likely waiting
    // for the core, and a futex or epoll wake-up per hop cost more than the hop. Measured, 4
    // ranks on 2 cores, 8 B allreduce over shm: 57 us sleeping at once, 14-43 us yielding.
    // Larger calls sleep at once as before: their wait is a peer's copies, which need the core.
    engine_->setSpinTime(kShmSpinTime, kYieldingMaxBytes);
    engine_->setYieldAfter(std::chrono::microseconds(0));
    // Measured, 4 ranks on 2 cores, 8 B allreduce over tcp: of 6 sendmsg per rank and call, 2
    // were credits returned at the first idle moment; batched, 44 -> 37 us (medians of eight).
    engine_->setCreditFlushAfter(std::chrono::microseconds(20));
    GS_LOG_INFO("%d ranks share %d cores on this host: yielding the core while waiting", localRanks,
                cores);
  } else if (plan.shmLinks > 0) {
    engine_->setSpinTime(kShmSpinTime);
  } else {
    // Network links only, a core per rank: poll as long in calls up to 2 MiB, where the wait is
    // a round trip, not the kernel's copies. Measured over loopback tcp, 2 ranks: 8 B allreduce
    // 5-6 us instead of 6-57 (the rank slept in epoll first), 64 KiB 19-22 instead of 72-75,
    // 2 MiB 780-810 instead of 880-990; at 4 MiB polling took the core from the kernel's copies
    // (1985-2019 instead of 1730-1757).
    engine_->setSpinTime(kShmSpinTime, 2 << 20);
  }
}

void Communicator::logReady(const LinkPlan& plan, const std::string& bindAddress) const {
  if (!metrics_->exporterAddress().empty()) {
    GS_LOG_INFO("rank %d serves Prometheus metrics at http://%s/metrics", rank_,
                metrics_->exporterAddress().c_str());
  }
  GS_LOG_INFO(
      "communicator ready: rank %d of %d on host %d of %d (%zu ranks on %d cores there; 0: not "
      "known), transport %s on %s, %zu peers, chunk %lld B x %lld slots, GS_ALGO=%s",
      rank_, nranks_, topology_.hostOf[rank_], topology_.hosts(),
      topology_.ranksOn(topology_.hostOf[rank_]).size(), topology_.coresOn(topology_.hostOf[rank_]),
      transportName_.c_str(), bindAddress.c_str(), plan.peers.size(),
      static_cast<long long>(engine_->chunkBytes()), static_cast<long long>(config_.slotsPerPeer),
      config_.algo.c_str());
}

}  // namespace gs::control
