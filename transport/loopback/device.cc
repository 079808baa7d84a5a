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

// A connect() call waiting for its peer's matching call.
struct Offer {
  std::shared_ptr<Link> link;
  AuthTag proof{};
  bool joined = false;
  std::string rejected;  // set when the peer's proof did not match
};

// Process-global: live devices by fabric and rank, and connect() calls waiting for a partner.
struct Fabric {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, std::map<int, const Device*>> devices;
  std::map<std::tuple<uint64_t, int, int>, std::shared_ptr<Offer>> offers;  // by (fabric, from, to)
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
  ranks[rank_] = this;
}

Device::~Device() {
  Fabric& f = fabric();
  std::lock_guard lock(f.mutex);
  auto it = f.devices.find(fabricId_);
  if (it != f.devices.end()) {
    it->second.erase(rank_);
    if (it->second.empty()) f.devices.erase(it);
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
  // The peer may already be waiting with an offer addressed to us.
  auto theirs = f.offers.find({fabricId_, peer, rank_});
  if (theirs != f.offers.end()) {
    std::shared_ptr<Offer> offer = theirs->second;
    f.offers.erase(theirs);
    if (!tagsEqual(offer->proof, proof_)) {
      offer->rejected = "authentication failed";
      f.changed.notify_all();
      GS_LOG_WARN("rejected loopback connection from rank %d: it does not hold the "
                  "communicator secret", peer);
      throw Error(Errc::kRemote, formatString("loopback connect to rank %d: authentication "
                                              "failed (different communicator secret)", peer));
    }
    Side& side = offer->link->sides[mySide];
    side.rank = rank_;
    side.regions = regions_;
    side.activity = activity_;
    offer->joined = true;
    f.changed.notify_all();
    return std::make_unique<Connection>(offer->link, mySide);
  }

  auto offer = std::make_shared<Offer>();
  offer->link = std::make_shared<Link>();
  offer->proof = proof_;
  Side& side = offer->link->sides[mySide];
  side.rank = rank_;
  side.regions = regions_;
  side.activity = activity_;
  const auto key = std::make_tuple(fabricId_, rank_, peer);
  GS_CHECK(f.offers.find(key) == f.offers.end(), Errc::kInvalidArgument,
           "loopback connect to rank %d: already connecting", peer);
  f.offers[key] = offer;
  bool done = f.changed.wait_until(lock, deadline.at(),
                                   [&] { return offer->joined || !offer->rejected.empty(); });
  if (!done) {
    f.offers.erase(key);
    throw Error(Errc::kTimeout,
                formatString("loopback connect to rank %d (fabric %llu) timed out: the peer "
                             "did not connect", peer, static_cast<unsigned long long>(fabricId_)));
  }
  if (!offer->rejected.empty()) {
    GS_LOG_WARN("rejected loopback connection from rank %d: it does not hold the communicator "
                "secret", peer);
    throw Error(Errc::kRemote, formatString("loopback connect to rank %d: authentication failed "
                                            "(different communicator secret)", peer));
  }
  return std::make_unique<Connection>(offer->link, mySide);
}

void Device::waitForActivity(std::chrono::microseconds maxWait) { activity_->wait(maxWait); }

void Device::interrupt() { activity_->notify(); }

}  // namespace gs::transport::loopback
