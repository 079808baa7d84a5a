#include "transport/tcp/device.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/memory.h"
#include "transport/tcp/wire.h"

namespace gs::transport::tcp {
namespace {

namespace asio = boost::asio;

constexpr int kMaxSocketsPerPeer = 64;

}  // namespace

Device::Device(const DeviceOptions& options) : regions_(std::make_shared<RegionTable>()) {
  params_.rank = options.rank;
  params_.nranks = options.nranks;
  params_.secret = options.secret;
  params_.socketsPerPeer = static_cast<int>(options.config.socketsPerPeer);
  params_.handshakeTimeoutMs = options.config.timeoutMs;
  GS_CHECK(params_.rank >= 0 && params_.rank < params_.nranks, Errc::kInvalidArgument,
           "tcp device: rank %d outside [0, %d)", params_.rank, params_.nranks);
  GS_CHECK(params_.socketsPerPeer >= 1 && params_.socketsPerPeer <= kMaxSocketsPerPeer,
           Errc::kInvalidArgument, "tcp device: socketsPerPeer %lld outside [1, %d]",
           static_cast<long long>(options.config.socketsPerPeer), kMaxSocketsPerPeer);
  const std::string bind = options.bindAddress.empty() ? "127.0.0.1" : options.bindAddress;
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(bind, ec);
  GS_CHECK(!ec, Errc::kInvalidArgument, "tcp: bind address \"%s\" is not an IPv4 or IPv6 literal",
           bind.c_str());
  GS_CHECK(!address.is_unspecified(), Errc::kInvalidArgument,
           "tcp: bind address %s is a wildcard; peers need a concrete address to dial",
           bind.c_str());
  listener_ = std::make_unique<sockets::Listener>(io_, address, params_);
  GS_LOG_DEBUG("tcp: rank %d listening on %s", params_.rank,
               sockets::endpointText(listener_->endpoint()).c_str());
}

Device::~Device() {
  {
    std::lock_guard lock(connectionsMutex_);
    if (!connections_.empty()) {
      GS_LOG_ERROR("tcp device destroyed with %zu live connections", connections_.size());
    }
  }
}

DeviceProperties Device::properties() const {
  DeviceProperties p;
  p.name = "tcp";
  p.bandwidthGbps = 10;
  p.latencyUs = 20;
  p.maxWriteBytes = kMaxFrameBytes;
  return p;
}

std::unique_ptr<transport::MemoryRegion> Device::registerMemory(void* data, size_t bytes) {
  return std::make_unique<MemoryRegion>(data, bytes, regions_);
}

std::vector<uint8_t> Device::address() const {
  return sockets::endpointBlob(listener_->endpoint(), params_.rank);
}

std::unique_ptr<transport::Connection> Device::connect(int peer,
                                                       std::span<const uint8_t> peerAddress,
                                                       Deadline deadline) {
  const asio::ip::tcp::endpoint endpoint =
      sockets::parseEndpointBlob(peerAddress, peer, params_, "tcp");
  const std::string where = sockets::endpointText(endpoint);
  std::vector<sockets::Socket> connected =
      sockets::establish(io_, *listener_, params_, peer, endpoint, deadline);
  GS_LOG_DEBUG("tcp: connected to rank %d (%s) with %zu sockets", peer, where.c_str(),
               connected.size());
  return std::make_unique<Connection>(*this, peer, where, std::move(connected), regions_);
}

void Device::attach(Connection* connection) {
  std::lock_guard lock(connectionsMutex_);
  connections_.push_back(connection);
}

void Device::detach(Connection* connection) {
  std::lock_guard lock(connectionsMutex_);
  connections_.erase(std::remove(connections_.begin(), connections_.end(), connection),
                     connections_.end());
}

void Device::wait(std::chrono::microseconds maxWait, const Watched& watched) {
  pollFds_.clear();
  pollFds_.push_back(wakeup_.pollFd());
  {
    std::lock_guard lock(connectionsMutex_);
    // Unwatched sockets stay out: one holding bytes for a later call stays readable and would
    // end every wait at once (transport::Device::waitForActivityOn).
    for (Connection* c : connections_) {
      if (watched(c))
        c->appendPollFds(pollFds_);
    }
  }
  if (pollFor(pollFds_, maxWait) > 0 && (pollFds_[0].revents & POLLIN))
    wakeup_.drain();
}

void Device::interrupt() {
  wakeup_.notify();
}

}  // namespace gs::transport::tcp
