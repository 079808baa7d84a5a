#include "transport/verbs/device.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/verbs/connection.h"
#include "transport/verbs/gpu_memory.h"
#include "transport/verbs/qp_handshake.h"
#include "transport/verbs/wire.h"

namespace gs::transport::verbs {
namespace {

namespace asio = boost::asio;

constexpr int kSetupPollMs = 50;

void setNonBlocking(int fd, const char* what) {
  const int flags = fcntl(fd, F_GETFL);
  GS_CHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, Errc::kSystem,
           "verbs: cannot make the %s non-blocking: %s", what, strerror(errno));
}

double portGbps(const ibv_port_attr& a) {
  // Per-lane rates (Gb/s) by active_speed code, times the lane count of active_width.
  double lane = 2.5;
  switch (a.active_speed) {
    case 2:
      lane = 5;
      break;
    case 4:
    case 8:
      lane = 10;
      break;
    case 16:
      lane = 14;
      break;
    case 32:
      lane = 25;
      break;
    case 64:
      lane = 50;
      break;
    case 128:
      lane = 100;
      break;
    default:
      break;
  }
  const int lanes = a.active_width == 2   ? 4
                    : a.active_width == 4 ? 8
                    : a.active_width == 8 ? 12
                                          : 1;
  return lane * lanes;
}

}  // namespace

Device::Device(const DeviceOptions& options)
    : config_(options.config), port_(selectPort(options.config, options.rank)) {
  params_.rank = options.rank;
  params_.nranks = options.nranks;
  params_.secret = options.secret;
  params_.socketsPerPeer = 1;
  params_.backend = "verbs";
  params_.handshakeTimeoutMs = options.config.timeoutMs;
  GS_CHECK(params_.rank >= 0 && params_.rank < params_.nranks, Errc::kInvalidArgument,
           "verbs device: rank %d outside [0, %d)", params_.rank, params_.nranks);
  // On a throw below, the members made so far are destroyed in reverse order.
  pd_.reset(ibv_alloc_pd(port_.context.get()));
  GS_CHECK(pd_ != nullptr, Errc::kSystem, "verbs %s: cannot allocate a protection domain: %s",
           port_.name().c_str(), strerror(errno));
  channel_.reset(ibv_create_comp_channel(port_.context.get()));
  GS_CHECK(channel_ != nullptr, Errc::kSystem, "verbs %s: cannot create a completion channel",
           port_.name().c_str());
  setNonBlocking(channel_->fd, "completion channel");
  setNonBlocking(port_.context->async_fd, "async event queue");
  cache_ = std::make_shared<RegistrationCache>(pd_.get(), port_.name());
  const std::string bind = options.bindAddress.empty() ? "127.0.0.1" : options.bindAddress;
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(bind, ec);
  GS_CHECK(!ec && !address.is_unspecified(), Errc::kInvalidArgument,
           "verbs: bind address \"%s\" for connection set-up is not a concrete IP address",
           bind.c_str());
  listener_ = std::make_unique<sockets::Listener>(io_, address, params_);
  listener_->setServiceHook([this] { progressPassive(); });
  GS_LOG_INFO("verbs: rank %d uses %s, GID %s, active MTU %d, GPU buffers: %s", params_.rank,
              port_.name().c_str(), port_.gidDescription.c_str(),
              128 << static_cast<int>(port_.attr.active_mtu), gpuMemoryPath().c_str());
}

Device::~Device() {
  {
    std::lock_guard lock(connectionsMutex_);
    if (!connections_.empty())
      GS_LOG_ERROR("verbs device destroyed with %zu live connections", connections_.size());
  }
  passive_.clear();
  listener_.reset();
  // Regions keep the cache alive; if one outlives us its MR pins the PD, which then leaks
  // rather than failing under a registration still in use.
  const bool regionsLeft = cache_.use_count() > 1;
  cache_.reset();
  if (regionsLeft) {
    GS_LOG_ERROR("verbs %s: device destroyed while memory regions are still registered",
                 port_.name().c_str());
    (void)pd_.release();  // left to the regions' MRs; the context then stays open as well
    (void)port_.context.release();
  }
  // The members go in reverse order: channel, PD, then the context (port_).
}

DeviceProperties Device::properties() const {
  DeviceProperties p;
  p.name = "verbs:" + port_.name();
  p.bandwidthGbps = portGbps(port_.attr);
  p.latencyUs = 2;
  const std::string gpu = gpuMemoryPath();
  p.supportsGpuMemory = gpu.rfind("GPUDirect", 0) == 0;
  p.supportsDmaBuf = gpu.find("DMA-BUF") != std::string::npos;
  p.maxWriteBytes = port_.attr.max_msg_sz;
  p.registrationPinsMemory = true;
  return p;
}

std::unique_ptr<transport::MemoryRegion> Device::registerMemory(void* data, size_t bytes) {
  return cache_->registerMemory(data, bytes);
}

std::vector<uint8_t> Device::address() const {
  DeviceBlob blob{};
  blob.magic = kDeviceBlobMagic;
  blob.version = kVerbsWireVersion;
  const std::vector<uint8_t> side = sockets::endpointBlob(listener_->endpoint(), params_.rank);
  std::memcpy(&blob.side, side.data(), sizeof(blob.side));
  std::vector<uint8_t> out(sizeof(blob));
  std::memcpy(out.data(), &blob, sizeof(blob));
  return out;
}

std::unique_ptr<transport::Connection> Device::connect(int peer,
                                                       std::span<const uint8_t> peerAddress,
                                                       Deadline deadline) {
  DeviceBlob blob{};
  GS_CHECK(peerAddress.size() == sizeof(blob), Errc::kInvalidArgument,
           "verbs connect to rank %d: its address blob has %zu bytes, expected %zu (does it use "
           "another transport? set GS_TRANSPORT alike on every rank)",
           peer, peerAddress.size(), sizeof(blob));
  std::memcpy(&blob, peerAddress.data(), sizeof(blob));
  GS_CHECK(blob.magic == kDeviceBlobMagic && blob.version == kVerbsWireVersion,
           Errc::kInvalidArgument,
           "verbs connect to rank %d: not a verbs address (version %u; does it use another "
           "transport?)",
           peer, blob.version);
  const asio::ip::tcp::endpoint endpoint = sockets::parseEndpointBlob(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&blob.side), sizeof(blob.side)),
      peer, params_, "verbs");
  std::unique_ptr<Connection> connection;
  if (peer > params_.rank) {
    connection = awaitPassive(peer, endpoint, deadline);
  } else {
    std::vector<sockets::Socket> side =
        sockets::establish(io_, *listener_, params_, peer, endpoint, deadline);
    QpHandshake handshake(std::make_unique<Connection>(*this, peer, sockets::endpointText(endpoint),
                                                       std::move(side.front())),
                          params_.rank);
    std::vector<pollfd> fds;
    while (!handshake.step()) {
      GS_CHECK(!deadline.expired(), Errc::kTimeout, "verbs connect to rank %d (%s) timed out %s",
               peer, sockets::endpointText(endpoint).c_str(), handshake.progress().c_str());
      listener_->service();
      fds.clear();
      listener_->appendPollFds(fds);
      fds.push_back(handshake.pollFd());
      ::poll(fds.data(), fds.size(), std::min(kSetupPollMs, std::max(deadline.remainingMs(), 1)));
    }
    connection = handshake.release();
  }
  GS_LOG_INFO("verbs: rank %d connected: %s, memory path %s (GPU buffers: %s)", params_.rank,
              connection->describe().c_str(), memoryPathName(MemoryPath::kHost),
              gpuMemoryPath().c_str());
  std::lock_guard lock(connectionsMutex_);
  connections_.push_back(connection.get());
  return connection;
}

// Higher ranks dial us; their set-ups advance in progressPassive() (the listener's hook)
// whichever connect() we are in. Here we wait for this peer's to finish.
std::unique_ptr<Connection> Device::awaitPassive(int peer,
                                                 const boost::asio::ip::tcp::endpoint& endpoint,
                                                 Deadline deadline) {
  std::vector<pollfd> fds;
  for (;;) {
    listener_->service();
    auto it = passive_.find(peer);
    if (it != passive_.end()) {
      if (!it->second.error.empty()) {
        const Error e(it->second.errc, it->second.error);
        passive_.erase(it);
        throw e;
      }
      if (it->second.ready) {
        std::unique_ptr<Connection> c = it->second.handshake->release();
        passive_.erase(it);
        return c;
      }
    }
    if (deadline.expired()) {
      const bool started = it != passive_.end() && it->second.handshake;
      throw Error(Errc::kTimeout, formatString("verbs connect to rank %d (%s) timed out %s", peer,
                                               sockets::endpointText(endpoint).c_str(),
                                               started ? it->second.handshake->progress().c_str()
                                                       : "waiting for it to dial in"));
    }
    fds.clear();
    listener_->appendPollFds(fds);
    for (auto& [rank, p] : passive_) {
      if (p.handshake && !p.ready && p.error.empty())
        fds.push_back(p.handshake->pollFd());
    }
    ::poll(fds.data(), fds.size(), std::min(kSetupPollMs, std::max(deadline.remainingMs(), 1)));
  }
}

void Device::progressPassive() {
  int peer = -1;
  std::vector<sockets::Socket> side;
  while (listener_->takeAny(&peer, side)) {
    if (peer <= params_.rank || passive_.count(peer) > 0) {
      GS_LOG_WARN("verbs: rank %d dialed out of turn or twice; ignoring the extra connection",
                  peer);
      continue;
    }
    Passive& p = passive_[peer];
    try {
      boost::system::error_code ec;
      const auto remote = side.front().remote_endpoint(ec);
      p.handshake = std::make_unique<QpHandshake>(
          std::make_unique<Connection>(*this, peer, ec ? "?" : sockets::endpointText(remote),
                                       std::move(side.front())),
          params_.rank);
    } catch (const Error& e) {
      p.errc = e.code();
      p.error = e.what();
    }
  }
  for (auto& [rank, p] : passive_) {
    if (!p.handshake || p.ready || !p.error.empty())
      continue;
    try {
      p.ready = p.handshake->step();
    } catch (const Error& e) {
      p.errc = e.code();
      p.error = e.what();
    }
  }
}

void Device::detach(Connection* connection) {
  std::lock_guard lock(connectionsMutex_);
  connections_.erase(std::remove(connections_.begin(), connections_.end(), connection),
                     connections_.end());
}

void Device::drainChannel() noexcept {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(channel_.get(), &cq, &context) == 0)
    static_cast<Connection*>(context)->countCqEvent();
}

void Device::serviceAsyncEvents() noexcept {
  ibv_async_event event{};
  while (ibv_get_async_event(port_.context.get(), &event) == 0) {
    const char* what = ibv_event_type_str(event.event_type);
    std::lock_guard lock(connectionsMutex_);
    switch (event.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR:
        for (Connection* c : connections_) {
          if (c->ownsQp(event.element.qp)) {
            c->fail(Errc::kSystem,
                    formatString("verbs %s: QP 0x%x to rank %d: async event %s",
                                 port_.name().c_str(), event.element.qp->qp_num, c->peer(), what));
          }
        }
        break;
      case IBV_EVENT_CQ_ERR:
        for (Connection* c : connections_) {
          if (c->cq() == event.element.cq)
            c->fail(Errc::kSystem, formatString("verbs %s: CQ of the connection to rank %d "
                                                "overran (async event %s)",
                                                port_.name().c_str(), c->peer(), what));
        }
        break;
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_DEVICE_FATAL:
        for (Connection* c : connections_) {
          c->fail(Errc::kSystem, formatString("verbs %s: %s (connection to rank %d lost)",
                                              port_.name().c_str(), what, c->peer()));
        }
        break;
      default:
        GS_LOG_INFO("verbs %s: async event %s", port_.name().c_str(), what);
        break;
    }
    ibv_ack_async_event(&event);
  }
}

void Device::wait(std::chrono::microseconds maxWait, const Watched& watched) {
  pollFds_.clear();
  pollFds_.push_back(wakeup_.pollFd());
  pollFds_.push_back(pollfd{channel_->fd, POLLIN, 0});
  pollFds_.push_back(pollfd{port_.context->async_fd, POLLIN, 0});
  {
    std::lock_guard lock(connectionsMutex_);
    // Arm, then look once more: a completion that arrived before arming raises no event.
    for (Connection* c : connections_)
      c->armCompletionEvents();
    // Every connection drains (its receives go back), but completions queued for a later call
    // count only where watched (transport::Device::waitForActivityOn).
    bool news = false;
    for (Connection* c : connections_)
      news |= c->drain() && watched(c);
    if (news)
      return;
    for (Connection* c : connections_)
      c->appendPollFds(pollFds_);
  }
  if (pollFor(pollFds_, maxWait) <= 0)
    return;
  if (pollFds_[0].revents & POLLIN)
    wakeup_.drain();
  if (pollFds_[1].revents & POLLIN)
    drainChannel();
  if (pollFds_[2].revents & POLLIN)
    serviceAsyncEvents();
  bool sideActivity = false;
  for (size_t i = 3; i < pollFds_.size(); ++i)
    sideActivity |= pollFds_[i].revents != 0;
  if (sideActivity) {
    std::lock_guard lock(connectionsMutex_);
    for (Connection* c : connections_)
      c->checkSide();
  }
}

void Device::interrupt() {
  wakeup_.notify();
}

}  // namespace gs::transport::verbs
