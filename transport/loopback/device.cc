#include "transport/loopback/device.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "common/error.h"
#include "common/log.h"
#include "transport/loopback/memory.h"

namespace gs::transport::loopback {
namespace {

// Address blob: magic, fabric id, rank (native byte order: it never leaves the process).
constexpr uint32_t kAddressMagic = 0x47534c42;  // "GSLB"
struct AddressBlob {
  uint32_t magic;
  int32_t rank;
  uint64_t fabricId;
};
static_assert(sizeof(AddressBlob) == 16);

// What pairing needs to know about a live device.
struct DeviceInfo {
  std::shared_ptr<RegionTable> regions;
  std::shared_ptr<Activity> activity;
  AuthTag proof{};
};

// Process-global: live devices by fabric and rank, and links created by one rank's connect()
// that the peer's connect() has not claimed yet.
//
// A connect() completes as soon as the peer's device exists (like dialing a listening socket):
// waiting for the peer's matching connect() instead would deadlock ranks that connect in
// different orders (0 waits for 2, 2 for 1, 1 for 0).
struct Fabric {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, std::map<int, DeviceInfo>> devices;
  std::map<std::tuple<uint64_t, int, int>, std::shared_ptr<Link>>
      unclaimed;  // (fabric, owner, creator)
};

Fabric& fabric() {
  static Fabric* f = new Fabric;  // never destroyed: devices may outlive static destruction
  return *f;
}

}  // namespace

Device::Device(const DeviceOptions& options)
    : rank_(options.rank),
      nranks_(options.nranks),
      fabricId_(options.fabricId),
      regions_(std::make_shared<RegionTable>()),
      activity_(std::make_shared<Activity>()) {
  GS_CHECK(rank_ >= 0 && rank_ < nranks_, Errc::kInvalidArgument,
           "loopback device: rank %d outside [0, %d)", rank_, nranks_);
  proof_ = authTag(options.secret, "gs-loopback-proof", &fabricId_, sizeof(fabricId_));
  Fabric& f = fabric();
  std::lock_guard lock(f.mutex);
  auto& ranks = f.devices[fabricId_];
  GS_CHECK(ranks.find(rank_) == ranks.end(), Errc::kInvalidArgument,
           "loopback fabric %llu already has a device for rank %d",
           static_cast<unsigned long long>(fabricId_), rank_);
  ranks[rank_] = DeviceInfo{regions_, activity_, proof_};
  f.changed.notify_all();
}

Device::~Device() {
  Fabric& f = fabric();
  std::lock_guard lock(f.mutex);
  auto it = f.devices.find(fabricId_);
  if (it != f.devices.end()) {
    it->second.erase(rank_);
    if (it->second.empty())
      f.devices.erase(it);
  }
  // Links made for us that we never claimed: their creators must learn we are gone. Links we
  // made that the peer never claimed were failed by our Connection's destructor already.
  for (auto u = f.unclaimed.begin(); u != f.unclaimed.end();) {
    const auto& [fabricId, owner, creator] = u->first;
    if (fabricId == fabricId_ && (owner == rank_ || creator == rank_)) {
      if (owner == rank_) {
        std::lock_guard linkLock(u->second->mutex);
        failSide(u->second->sides[creator < owner ? 0 : 1],
                 formatString("peer rank %d closed the connection", rank_));
      }
      u = f.unclaimed.erase(u);
    } else {
      ++u;
    }
  }
}

DeviceProperties Device::properties() const {
  DeviceProperties p;
  p.name = "loopback";
  p.bandwidthGbps = 100;
  p.latencyUs = 1;
  p.maxWriteBytes = UINT32_MAX;
  return p;
}

std::unique_ptr<transport::MemoryRegion> Device::registerMemory(void* data, size_t bytes) {
  return std::make_unique<MemoryRegion>(data, bytes, regions_);
}

std::vector<uint8_t> Device::address() const {
  AddressBlob blob{kAddressMagic, rank_, fabricId_};
  std::vector<uint8_t> out(sizeof(blob));
  std::memcpy(out.data(), &blob, sizeof(blob));
  return out;
}

std::unique_ptr<transport::Connection> Device::connect(int peer,
                                                       std::span<const uint8_t> peerAddress,
                                                       Deadline deadline) {
  AddressBlob blob{};
  GS_CHECK(peerAddress.size() == sizeof(blob), Errc::kInvalidArgument,
           "loopback connect to rank %d: address blob of %zu bytes, expected %zu", peer,
           peerAddress.size(), sizeof(blob));
  std::memcpy(&blob, peerAddress.data(), sizeof(blob));
  GS_CHECK(blob.magic == kAddressMagic, Errc::kInvalidArgument,
           "loopback connect to rank %d: not a loopback address blob", peer);
  GS_CHECK(blob.rank == peer && peer != rank_ && peer >= 0 && peer < nranks_,
           Errc::kInvalidArgument, "loopback connect: peer %d (blob says rank %d, we are %d of %d)",
           peer, blob.rank, rank_, nranks_);
  GS_CHECK(blob.fabricId == fabricId_, Errc::kInvalidArgument,
           "loopback connect to rank %d: it is on fabric %llu, we are on %llu", peer,
           static_cast<unsigned long long>(blob.fabricId),
           static_cast<unsigned long long>(fabricId_));

  const int mySide = rank_ < peer ? 0 : 1;
  Fabric& f = fabric();
  std::unique_lock lock(f.mutex);
  auto& ranks = f.devices[fabricId_];
  bool present = f.changed.wait_until(lock, deadline.at(), [&] {
    return ranks.count(peer) || f.unclaimed.count({fabricId_, rank_, peer});
  });
  // The peer may have connected to us first: its link is waiting for us.
  auto made = f.unclaimed.find({fabricId_, rank_, peer});
  if (made != f.unclaimed.end()) {
    std::shared_ptr<Link> link = std::move(made->second);
    f.unclaimed.erase(made);
    return std::make_unique<Connection>(std::move(link), mySide);
  }
  if (!present) {
    throw Error(Errc::kTimeout,
                formatString("loopback connect to rank %d (fabric %llu) timed out: no device for "
                             "that rank joined the fabric",
                             peer, static_cast<unsigned long long>(fabricId_)));
  }
  const DeviceInfo& theirs = ranks.at(peer);
  if (!tagsEqual(theirs.proof, proof_)) {
    GS_LOG_WARN(
        "rejected loopback connection from rank %d: it does not hold the communicator "
        "secret",
        peer);
    throw Error(Errc::kRemote, formatString("loopback connect to rank %d: authentication failed "
                                            "(different communicator secret)",
                                            peer));
  }
  auto link = std::make_shared<Link>();
  Side& mine = link->sides[mySide];
  mine.rank = rank_;
  mine.regions = regions_;
  mine.activity = activity_;
  Side& other = link->sides[1 - mySide];
  other.rank = peer;
  other.regions = theirs.regions;
  other.activity = theirs.activity;
  GS_CHECK(f.unclaimed.emplace(std::make_tuple(fabricId_, peer, rank_), link).second,
           Errc::kInvalidArgument, "loopback connect to rank %d: already connected", peer);
  return std::make_unique<Connection>(std::move(link), mySide);
}

// One flag for every connection, cleared by the wake-up it causes: news never ends more than
// one wait, so which connections are watched does not matter.
void Device::wait(std::chrono::microseconds maxWait, const Watched&) {
  activity_->wait(maxWait);
}

void Device::interrupt() {
  activity_->notify();
}

}  // namespace gs::transport::loopback
