#include "transport/shm/device.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "transport/shm/connection.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/peer_memory.h"

namespace gs::transport::shm {
namespace {

// Memory only this process reaches: a write source or a receive target. Peers cannot write
// into it, so its key is empty.
class LocalRegion final : public MemoryRegion {
 public:
  using MemoryRegion::MemoryRegion;
  RemoteKey remoteKey() const override { return RemoteKey{}; }
};

// A shared segment peers map and write into; the region owns it (and its name).
class SharedRegion final : public MemoryRegion {
 public:
  SharedRegion(std::unique_ptr<Segment> segment, size_t bytes, const RegionKey& key)
      : MemoryRegion(segment->data(), bytes), segment_(std::move(segment)) {
    std::memcpy(key_.bytes, &key, sizeof(key));
    key_.length = sizeof(key);
  }
  RemoteKey remoteKey() const override { return key_; }

 private:
  std::unique_ptr<Segment> segment_;
  RemoteKey key_;
};

// Where this process lives: AddressBlob's domain fields.
void fillDomain(AddressBlob& d) {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string uuid;
  boot >> uuid;
  size_t nibble = 0;
  for (char c : uuid) {
    const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0 || nibble >= 32)
      continue;
    d.bootId[nibble / 2] |= static_cast<uint8_t>(nibble % 2 ? v : v << 4);
    ++nibble;
  }
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) == 0)
    d.pidNamespace = st.st_ino;
  if (stat("/dev/shm", &st) == 0)
    d.shmDevice = st.st_dev;
}

bool parseBlob(std::span<const uint8_t> bytes, AddressBlob* out) {
  if (bytes.size() != sizeof(AddressBlob))
    return false;
  std::memcpy(out, bytes.data(), sizeof(*out));
  if (out->magic != AddressBlob::kMagic || out->version != kWireVersion)
    return false;
  // The prefix names files: "/gs-" then digits, lowercase hex and dashes, NUL-terminated.
  const size_t length = strnlen(out->prefix, sizeof(out->prefix));
  if (length == sizeof(out->prefix) || std::strncmp(out->prefix, "/gs-", 4) != 0)
    return false;
  for (size_t i = 4; i < length; ++i) {
    const char c = out->prefix[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-'))
      return false;
  }
  return true;
}

bool sameDomain(const AddressBlob& a, const AddressBlob& b) {
  return std::memcmp(a.bootId, b.bootId, sizeof(a.bootId)) == 0 &&
         a.pidNamespace == b.pidNamespace && a.shmDevice == b.shmDevice;
}

AuthTag deviceProof(const Secret& secret, uint64_t token) {
  return authTag(secret, "gs-shm-device", &token, sizeof(token));
}

// The hello `writerRank` puts in a connection: binds both devices and both ranks.
AuthTag helloProof(const Secret& secret,
                   uint64_t dialerToken,
                   uint64_t acceptorToken,
                   int32_t dialerRank,
                   int32_t acceptorRank,
                   int32_t writerRank) {
  struct {
    uint64_t dialerToken, acceptorToken;
    int32_t dialerRank, acceptorRank, writerRank, zero;
  } message{dialerToken, acceptorToken, dialerRank, acceptorRank, writerRank, 0};
  return authTag(secret, "gs-shm-hello", &message, sizeof(message));
}

// Opens a segment that should appear before the deadline; null when it did not. `gone` is
// asked between tries and ends the wait early with its (non-empty) reason.
template <class Gone>
std::unique_ptr<Segment> waitForSegment(const std::string& name,
                                        Deadline deadline,
                                        Gone&& gone,
                                        std::string* why) {
  auto pause = std::chrono::microseconds(50);
  while (true) {
    if (auto s = Segment::open(name))
      return s;
    *why = gone();
    if (!why->empty() || deadline.expired())
      return nullptr;
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

// Whether process_vm_readv reaches the peer: its token, read where its blob says it lies.
bool readsMemoryOf(const AddressBlob& peer) {
  uint64_t token = 0;
  return peer.probeAddress != 0 &&
         readProcessMemory(peer.pid, peer.probeAddress, &token, sizeof(token), nullptr) &&
         token == peer.token;
}

void writeHello(
    Half& half, int32_t rank, uint64_t token, const AuthTag& proof, bool readsPeerMemory) {
  half.hello.rank = rank;
  half.hello.readsPeerMemory = readsPeerMemory ? 1u : 0u;
  half.hello.pid = static_cast<int32_t>(getpid());
  half.hello.token = token;
  half.hello.proof = proof;
  storeRelease(half.hello.state, 1u);
}

}  // namespace

bool sameDomain(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  AddressBlob x, y;
  return parseBlob(a, &x) && parseBlob(b, &y) && sameDomain(x, y);
}

Device::Device(const DeviceOptions& options)
    : rank_(options.rank),
      nranks_(options.nranks),
      secret_(options.secret),
      singleCopy_(options.config.shmSingleCopy) {
  GS_CHECK(rank_ >= 0 && rank_ < nranks_, Errc::kInvalidArgument,
           "shm device: rank %d outside [0, %d)", rank_, nranks_);
  // Every device sweeps, not only a process's first: survivors of a killed rank that form a
  // new communicator in the same processes reclaim what it left (one readdir of /dev/shm).
  if (int n = removeStaleSegments())
    GS_LOG_INFO("shm: removed %d segments left in /dev/shm by exited processes", n);
  const Secret random = randomSecret();
  std::memcpy(&token_, random.data(), sizeof(token_));
  prefix_ = formatString("/gs-%d-%016llx", static_cast<int>(getpid()),
                         static_cast<unsigned long long>(token_));
  control_ = Segment::create(controlSegmentName(prefix_), sizeof(ControlBlock));
  ControlBlock& c = control();
  c.version = kWireVersion;
  c.token = token_;
  c.proof = deviceProof(secret_, token_);
  c.rank = rank_;
  c.pid = static_cast<int32_t>(getpid());
  storeRelease(c.magic, ControlBlock::kMagic);
  address_.rank = rank_;
  address_.pid = static_cast<int32_t>(getpid());
  address_.token = token_;
  fillDomain(address_);
  std::strncpy(address_.prefix, prefix_.c_str(), sizeof(address_.prefix) - 1);
  if (singleCopy_)
    address_.probeAddress = reinterpret_cast<uintptr_t>(&token_);
}

Device::~Device() {
  storeRelease(control().closed, 1u);
  ringAlways(control());
}

ControlBlock& Device::control() const {
  return *static_cast<ControlBlock*>(control_->data());
}

DeviceProperties Device::properties() const {
  DeviceProperties p;
  p.name = "shm";
  p.bandwidthGbps = 40;  // schedules/cost_model.cc: about 5 GB/s on the reference host
  p.latencyUs = 1;
  p.maxWriteBytes = UINT32_MAX;
  return p;
}

std::unique_ptr<transport::MemoryRegion> Device::registerMemory(void* data, size_t bytes) {
  return std::make_unique<LocalRegion>(data, bytes);
}

std::unique_ptr<transport::MemoryRegion> Device::allocateRegion(size_t bytes) {
  const uint32_t id = nextRegionId_++;
  auto segment = Segment::create(regionSegmentName(prefix_, id), bytes == 0 ? 1 : bytes);
  return std::make_unique<SharedRegion>(std::move(segment), bytes,
                                        RegionKey{RegionKey::kMagic, id, token_});
}

std::vector<uint8_t> Device::address() const {
  std::vector<uint8_t> out(sizeof(address_));
  std::memcpy(out.data(), &address_, sizeof(address_));
  return out;
}

std::unique_ptr<transport::Connection> Device::connect(int peer,
                                                       std::span<const uint8_t> peerAddress,
                                                       Deadline deadline) {
  AddressBlob theirs;
  GS_CHECK(parseBlob(peerAddress, &theirs), Errc::kInvalidArgument,
           "shm connect to rank %d: not an shm address blob (%zu bytes)", peer, peerAddress.size());
  GS_CHECK(theirs.rank == peer && peer != rank_ && peer >= 0 && peer < nranks_,
           Errc::kInvalidArgument, "shm connect: peer %d (blob says rank %d, we are %d of %d)",
           peer, theirs.rank, rank_, nranks_);
  GS_CHECK(sameDomain(address_, theirs), Errc::kUnsupported,
           "shm connect to rank %d: it does not share memory with us (another machine, "
           "container, pid namespace or /dev/shm)",
           peer);

  // The peer's device, through its control segment: exists as long as the device does.
  const std::string peerPrefix = theirs.prefix;
  std::string why;
  auto processGoneReason = [&]() -> std::string {
    if (processGone(theirs.pid))
      return formatString("rank %d (pid %d) exited before connecting", peer, theirs.pid);
    return std::string();
  };
  auto peerControl =
      waitForSegment(controlSegmentName(peerPrefix), deadline, processGoneReason, &why);
  GS_CHECK(why.empty(), Errc::kRemote, "shm connect to rank %d: %s", peer, why.c_str());
  GS_CHECK(peerControl != nullptr, Errc::kTimeout,
           "shm connect to rank %d timed out: its device (%s) is gone or never existed", peer,
           controlSegmentName(peerPrefix).c_str());
  GS_CHECK(peerControl->size() >= sizeof(ControlBlock), Errc::kRemote,
           "shm connect to rank %d: its control segment is %zu bytes", peer, peerControl->size());
  ControlBlock& pc = *static_cast<ControlBlock*>(peerControl->data());
  while (loadAcquire(pc.magic) != ControlBlock::kMagic && !deadline.expired())
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  GS_CHECK(loadAcquire(pc.magic) == ControlBlock::kMagic && pc.token == theirs.token, Errc::kRemote,
           "shm connect to rank %d: its control segment does not match its address", peer);
  if (!tagsEqual(pc.proof, deviceProof(secret_, theirs.token))) {
    GS_LOG_WARN("rejected shm connection from rank %d: it does not hold the communicator secret",
                peer);
    throw Error(Errc::kRemote, formatString("shm connect to rank %d: authentication failed "
                                            "(different communicator secret)",
                                            peer));
  }
  auto peerGone = [&]() -> std::string {
    if (loadAcquire(pc.closed) != 0)
      return formatString("rank %d closed its device before connecting", peer);
    return processGoneReason();
  };

  ConnectionSetup setup;
  setup.rank = rank_;
  setup.peer = peer;
  setup.side = rank_ < peer ? 0 : 1;
  setup.peerPrefix = peerPrefix;
  setup.peerToken = theirs.token;
  setup.peerPid = theirs.pid;
  const bool dialer = setup.side == 1;
  const uint64_t dialerToken = dialer ? token_ : theirs.token;
  const uint64_t acceptorToken = dialer ? theirs.token : token_;
  const int dialerRank = dialer ? rank_ : peer;
  const int acceptorRank = dialer ? peer : rank_;
  setup.expectedPeerProof =
      helloProof(secret_, dialerToken, acceptorToken, dialerRank, acceptorRank, peer);
  const AuthTag myProof =
      helloProof(secret_, dialerToken, acceptorToken, dialerRank, acceptorRank, rank_);
  const bool readsPeer = singleCopy_ && readsMemoryOf(theirs);
  GS_LOG_DEBUG("shm: rank %d %s read rank %d's memory (single copy)", rank_,
               readsPeer ? "can" : "cannot", peer);

  if (dialer) {
    // The dialer makes the connection and goes on; the acceptor's hello arrives later (poll
    // checks it), so no connect() ever waits for another rank's connect() call.
    setup.segment = Segment::create(connectionSegmentName(prefix_, peer), sizeof(ConnectionBlock));
    auto& block = *static_cast<ConnectionBlock*>(setup.segment->data());
    block.version = kWireVersion;
    storeRelease(block.magic, ConnectionBlock::kMagic);
    writeHello(block.halves[1], rank_, token_, myProof, readsPeer);
  } else {
    const std::string name = connectionSegmentName(peerPrefix, rank_);
    setup.segment = waitForSegment(name, deadline, peerGone, &why);
    if (!setup.segment && why.empty()) {
      throw Error(Errc::kTimeout, formatString("shm connect to rank %d timed out: it did not "
                                               "connect to us (no %s)",
                                               peer, name.c_str()));
    }
    GS_CHECK(setup.segment != nullptr, Errc::kRemote, "shm connect to rank %d: %s", peer,
             why.c_str());
    GS_CHECK(setup.segment->size() == sizeof(ConnectionBlock), Errc::kRemote,
             "shm connect to rank %d: its connection segment is %zu bytes, expected %zu", peer,
             setup.segment->size(), sizeof(ConnectionBlock));
    auto& block = *static_cast<ConnectionBlock*>(setup.segment->data());
    Half& dialerHalf = block.halves[1];
    while (loadAcquire(dialerHalf.hello.state) != 1) {
      why = peerGone();
      GS_CHECK(why.empty(), Errc::kRemote, "shm connect to rank %d: %s", peer, why.c_str());
      GS_CHECK(!deadline.expired(), Errc::kTimeout,
               "shm connect to rank %d timed out waiting for its hello", peer);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    Hello hello;
    std::memcpy(&hello, &dialerHalf.hello, sizeof(hello));
    if (hello.rank != peer || hello.token != theirs.token ||
        !tagsEqual(hello.proof, setup.expectedPeerProof)) {
      GS_LOG_WARN("rejected shm connection from rank %d: its hello does not prove the secret",
                  peer);
      throw Error(Errc::kRemote, formatString("shm connect to rank %d: authentication failed "
                                              "(invalid hello)",
                                              peer));
    }
    setup.peerReadsUs = hello.readsPeerMemory == 1;
    writeHello(block.halves[0], rank_, token_, myProof, readsPeer);
    setup.segment->unlink();  // both have it mapped: the name is no longer needed
  }
  ring(pc);
  setup.peerControl = std::move(peerControl);
  return std::make_unique<Connection>(*this, std::move(setup));
}

void Device::wait(std::chrono::microseconds maxWait, const Watched& watched) {
  ControlBlock& c = control();
  const uint32_t seen = prepareToSleep(c);
  bool news = interrupted_.exchange(false);
  if (!news) {
    std::lock_guard lock(connectionsMutex_);
    // A queue holding work for a later call keeps its news: unwatched, it is not looked at
    // (transport::Device::waitForActivityOn). A peer's ring still wakes this device.
    for (const Connection* connection : connections_) {
      if (watched(connection) && connection->hasNews()) {
        news = true;
        break;
      }
    }
  }
  sleepUntilRung(c, seen, maxWait, news);
}

void Device::interrupt() {
  interrupted_.store(true);
  ringAlways(control());
}

void Device::attach(Connection* connection) {
  std::lock_guard lock(connectionsMutex_);
  connections_.push_back(connection);
}

void Device::detach(Connection* connection) {
  std::lock_guard lock(connectionsMutex_);
  std::erase(connections_, connection);
}

}  // namespace gs::transport::shm
