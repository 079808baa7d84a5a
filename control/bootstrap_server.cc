// Rank 0's rendezvous listener and its connections: binding, the accept loop with its caps
// and deadline on connections that have not authenticated, framed reads, queued writes and
// closing. What the messages mean is bootstrap_registration.cc; the wire format is
// bootstrap_wire.h; the other end is bootstrap_client.cc.

#include <algorithm>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "common/error.h"
#include "common/log.h"
#include "control/bootstrap_asio.h"
#include "control/bootstrap_server_impl.h"

namespace gs::control {
namespace {

using wire::MsgType;

std::string endpointText(const tcp::endpoint& ep) {
  const auto& a = ep.address();
  std::string host = a.is_v6() ? "[" + a.to_string() + "]" : a.to_string();
  return host + ":" + std::to_string(ep.port());
}

}  // namespace

RendezvousServer::Impl::Impl(const std::string& address,
                             uint16_t port,
                             const Secret& s,
                             const Config& config)
    : secret(s),
      timeoutMs(config.timeoutMs),
      authMs(authDeadlineMs(config.timeoutMs)),
      acceptor(io),
      timer(io),
      creatorPid(getpid()) {
  IpAddress ip = IpAddress::parse(address, "rendezvous address");
  tcp::endpoint ep = toAsioEndpoint(ip, port);
  error_code ec;
  acceptor.open(ep.protocol(), ec);
  if (!ec)
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec)
    acceptor.bind(ep, ec);
  if (!ec)
    acceptor.listen(asio::socket_base::max_listen_connections, ec);
  GS_CHECK(!ec, Errc::kSystem, "rendezvous server cannot listen on %s: %s",
           formatEndpoint(ip, port).c_str(), ec.message().c_str());
  id.address = ip;
  id.port = acceptor.local_endpoint().port();
  id.secret = secret;
  GS_LOG_DEBUG("rendezvous server listening on %s", id.endpoint().c_str());
  // Until the first rank registers the listener lives one timeout; the first registration
  // restarts the clock for the whole rendezvous (onRegister).
  timer.expires_after(std::chrono::milliseconds(timeoutMs));
  timer.async_wait([this](error_code tec) {
    if (!tec && !done && nranks == 0)
      giveUp();
  });
  acceptNext();
  thread = std::thread([this] {
    try {
      io.run();
    } catch (const std::exception& e) {
      GS_LOG_ERROR("rendezvous server on %s stopped: %s", id.endpoint().c_str(), e.what());
    }
    finished.store(true);
  });
}

void RendezvousServer::Impl::stop() {
  std::lock_guard<std::mutex> lock(stopMutex);
  if (!thread.joinable())
    return;
  if (getpid() != creatorPid) {
    // A forked child holds a copy of this object but not the thread; joining it would be
    // undefined. Give the handle up without touching it.
    new std::thread(std::move(thread));  // NOLINT: deliberately leaked in the child.
    return;
  }
  io.stop();
  thread.join();
  // The thread has ended, so this thread may now close what it left behind.
  error_code ignored;
  acceptor.close(ignored);
  for (const auto& s : sessions)
    s->socket.close(ignored);
  sessions.clear();
  byRank.clear();
  finished.store(true);
}

void RendezvousServer::Impl::acceptNext() {
  if (unauthenticated >= kMaxUnauthenticated) {
    // Full: accept nothing until a connection registers or goes; those waiting stay in the
    // kernel's backlog, bounded by their own deadlines.
    acceptPaused = true;
    return;
  }
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec != asio::error::operation_aborted && !done) {
        GS_LOG_WARN("rendezvous server on %s: accept failed: %s", id.endpoint().c_str(),
                    ec.message().c_str());
        acceptNext();
      }
      return;
    }
    error_code peerEc;
    auto remote = socket.remote_endpoint(peerEc);
    auto session = std::make_shared<RendezvousSession>(
        std::move(socket), peerEc ? std::string("<unknown peer>") : endpointText(remote));
    sessions.insert(session);
    ++unauthenticated;
    session->authTimer.expires_after(std::chrono::milliseconds(authMs));
    session->authTimer.async_wait([this, session](error_code tec) {
      if (!tec && session->authenticating)
        reject(session, Errc::kTimeout,
               formatString("did not authenticate within %lld ms of connecting",
                            static_cast<long long>(authMs)));
    });
    readMessage(session, {MsgType::kHello}, [this, session] { onHello(session); });
    acceptNext();
  });
}

void RendezvousServer::Impl::authenticated(const SessionPtr& s) {
  if (!s->authenticating)
    return;
  s->authenticating = false;
  s->authTimer.cancel();
  --unauthenticated;
  if (acceptPaused && !done) {
    acceptPaused = false;
    acceptNext();
  }
}

void RendezvousServer::Impl::readMessage(const SessionPtr& s,
                                         std::initializer_list<MsgType> allowed,
                                         std::function<void()> next) {
  std::vector<MsgType> types(allowed);
  asio::async_read(s->socket, asio::buffer(s->header),
                   [this, s, types, next = std::move(next)](error_code ec, size_t) mutable {
                     if (ec)
                       return onConnectionLost(s, ec);
                     wire::Header h{};
                     try {
                       h = wire::decodeHeader(s->header.data(), types, nranks);
                     } catch (const Error& e) {
                       return reject(s, Errc::kInvalidArgument, e.what());
                     }
                     s->body.resize(h.bodyLen);
                     asio::async_read(s->socket, asio::buffer(s->body),
                                      [this, s, next = std::move(next)](error_code ec2, size_t) {
                                        if (ec2)
                                          return onConnectionLost(s, ec2);
                                        if (done)
                                          return reject(s, Errc::kInvalidArgument,
                                                        "the rendezvous is already over");
                                        try {
                                          next();
                                        } catch (const Error& e) {
                                          reject(s, Errc::kInvalidArgument, e.what());
                                        }
                                      });
                   });
}

void RendezvousServer::Impl::reject(const SessionPtr& s, Errc code, const std::string& why) {
  if (s->closed)
    return;
  GS_LOG_WARN("rejected rendezvous connection from %s: %s", s->peer.c_str(), why.c_str());
  sendShared(s, status(code, why));
  closeAfterFlush(s);
}

void RendezvousServer::Impl::send(const SessionPtr& s, std::vector<uint8_t> bytes) {
  sendShared(s, std::make_shared<const std::vector<uint8_t>>(std::move(bytes)));
}

void RendezvousServer::Impl::sendShared(const SessionPtr& s, SharedBytes bytes) {
  if (s->closed || s->closeWhenFlushed)
    return;
  s->outbox.push_back(std::move(bytes));
  if (!s->writing)
    writeNext(s);
}

void RendezvousServer::Impl::writeNext(const SessionPtr& s) {
  s->writing = true;
  asio::async_write(s->socket, asio::buffer(*s->outbox.front()), [this, s](error_code ec, size_t) {
    s->writing = false;
    s->outbox.pop_front();
    if (ec)
      return onConnectionLost(s, ec);
    if (!s->outbox.empty())
      return writeNext(s);
    if (s->closeWhenFlushed)
      close(s);
  });
}

void RendezvousServer::Impl::closeAfterFlush(const SessionPtr& s) {
  s->closeWhenFlushed = true;
  if (!s->writing && s->outbox.empty())
    close(s);
}

void RendezvousServer::Impl::onConnectionLost(const SessionPtr& s, const error_code& ec) {
  if (s->closed)
    return;
  if (s->registered && !done) {
    GS_LOG_WARN(
        "rendezvous: rank %d (%s) disconnected before the rendezvous completed (%s); "
        "its slot is free again",
        s->rank, s->peer.c_str(), ec.message().c_str());
  }
  close(s);
}

void RendezvousServer::Impl::close(const SessionPtr& s) {
  if (s->closed)
    return;
  s->closed = true;
  error_code ignored;
  s->socket.shutdown(tcp::socket::shutdown_both, ignored);
  s->socket.close(ignored);
  sessions.erase(s);
  authenticated(s);  // its slot in the unauthenticated pool is free
  if (s->registered && !done) {
    // A rank that left may come back (a retried process); until then it counts as missing.
    byRank[s->rank] = nullptr;
    if (s->hasPayload)
      --payloads;
  }
}

RendezvousServer::RendezvousServer(const std::string& address,
                                   uint16_t port,
                                   const Secret& secret,
                                   const Config& config)
    : impl_(std::make_unique<Impl>(address, port, secret, config)) {}

RendezvousServer::~RendezvousServer() = default;

UniqueId RendezvousServer::uniqueId() const {
  return impl_->id;
}
bool RendezvousServer::finished() const {
  return impl_->finished.load();
}
void RendezvousServer::stop() {
  impl_->stop();
}

}  // namespace gs::control
