#include "control/bootstrap.h"

#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "common/error.h"
#include "common/log.h"
#include "control/bootstrap_wire.h"

namespace gs::control {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using wire::MsgType;

asio::ip::address toAsio(const IpAddress& a) {
  if (a.family == IpAddress::Family::kV4) {
    asio::ip::address_v4::bytes_type b;
    std::copy_n(a.bytes.begin(), 4, b.begin());
    return asio::ip::address_v4(b);
  }
  asio::ip::address_v6::bytes_type b;
  std::copy_n(a.bytes.begin(), 16, b.begin());
  return asio::ip::address_v6(b);
}

std::string endpointText(const tcp::endpoint& ep) {
  const auto& a = ep.address();
  std::string host = a.is_v6() ? "[" + a.to_string() + "]" : a.to_string();
  return host + ":" + std::to_string(ep.port());
}

wire::Nonce randomNonce() {
  Secret bytes = randomSecret();
  wire::Nonce n{};
  std::copy_n(bytes.begin(), n.size(), n.begin());
  return n;
}

// "3, 5-7, 9": the ranks that are missing, compact enough for a 1024-rank job's error message.
std::string formatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    if (!out.empty())
      out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i)
      out += "-" + std::to_string(ranks[j]);
    i = j + 1;
    if (out.size() > 600) {
      out += ", ...";
      break;
    }
  }
  return out;
}

// One accepted connection. Lives while a handler or the server's tables refer to it; touched
// only on the server thread.
struct ServerSession : std::enable_shared_from_this<ServerSession> {
  ServerSession(tcp::socket s, std::string peerText)
      : socket(std::move(s)), peer(std::move(peerText)), authTimer(socket.get_executor()) {}

  tcp::socket socket;
  std::string peer;
  asio::steady_timer authTimer;  // closes the connection unless it registers in time
  bool authenticating = true;    // counted in RendezvousServer::Impl::unauthenticated
  std::array<uint8_t, wire::kHeaderBytes> header{};
  std::vector<uint8_t> body;
  wire::Nonce serverNonce{};
  int rank = -1;
  bool registered = false;
  bool hasPayload = false;
  bool closed = false;
  std::vector<uint8_t> payload;
  std::deque<std::shared_ptr<const std::vector<uint8_t>>> outbox;
  bool writing = false;
  bool closeWhenFlushed = false;
};
using SessionPtr = std::shared_ptr<ServerSession>;

}  // namespace

struct RendezvousServer::Impl {
  Impl(const std::string& address, uint16_t port, const Secret& s, const Config& config)
      : secret(s),
        timeoutMs(config.timeoutMs),
        authMs(authDeadlineMs(config.timeoutMs)),
        acceptor(io),
        timer(io),
        creatorPid(getpid()) {
    IpAddress ip = IpAddress::parse(address, "rendezvous address");
    tcp::endpoint ep(toAsio(ip), port);
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

  ~Impl() { stop(); }

  void stop() {
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

  // How long a connection may take from accept to a valid registration: a fraction of the
  // timeout, so connections that never authenticate cannot hold the listener's slots.
  static int64_t authDeadlineMs(int64_t timeoutMs) {
    return std::clamp<int64_t>(timeoutMs / 4, 100, 5000);
  }

  // ---- everything below runs on the server thread ----

  void acceptNext() {
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
      auto session = std::make_shared<ServerSession>(
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

  // A connection left the unauthenticated pool (registered or closed): maybe accept again.
  void authenticated(const SessionPtr& s) {
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

  // Reads one message whose type is in `allowed` into session->body, then calls `next`.
  void readMessage(const SessionPtr& s,
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

  void onHello(const SessionPtr& s) {
    wire::Nonce clientNonce{};
    std::copy_n(s->body.begin(), clientNonce.size(), clientNonce.begin());
    s->serverNonce = randomNonce();
    std::vector<uint8_t> tagInput(clientNonce.begin(), clientNonce.end());
    tagInput.insert(tagInput.end(), s->serverNonce.begin(), s->serverNonce.end());
    AuthTag tag = authTag(secret, wire::kServerDomain, tagInput.data(), tagInput.size());
    std::vector<uint8_t> body(s->serverNonce.begin(), s->serverNonce.end());
    body.insert(body.end(), tag.begin(), tag.end());
    send(s, wire::frame(MsgType::kChallenge, body));
    readMessage(s, {MsgType::kRegister}, [this, s] { onRegister(s); });
  }

  void onRegister(const SessionPtr& s) {
    wire::Registration r = wire::decodeRegistration(s->body);
    auto input = wire::registrationTagInput(s->serverNonce, r.rank, r.nranks);
    if (!tagsEqual(r.tag, authTag(secret, wire::kClientDomain, input.data(), input.size()))) {
      return reject(s, Errc::kInvalidArgument, "wrong communicator secret");
    }
    if (r.nranks < 1 || r.nranks > kMaxRendezvousRanks) {
      return reject(
          s, Errc::kInvalidArgument,
          formatString("nranks %d is out of range (1..%d)", r.nranks, kMaxRendezvousRanks));
    }
    if (r.rank < 0 || r.rank >= r.nranks) {
      return reject(s, Errc::kInvalidArgument,
                    formatString("rank %d is out of range for nranks %d", r.rank, r.nranks));
    }
    if (nranks != 0 && r.nranks != nranks) {
      return reject(s, Errc::kInvalidArgument,
                    formatString("nranks mismatch: rank %d says nranks=%d but the ranks "
                                 "registered before it said nranks=%d",
                                 r.rank, r.nranks, nranks));
    }
    if (nranks != 0 && byRank[r.rank]) {
      return reject(s, Errc::kInvalidArgument,
                    formatString("duplicate rank %d: rank %d is already registered from %s", r.rank,
                                 r.rank, byRank[r.rank]->peer.c_str()));
    }
    if (nranks == 0) {
      // The clock restarts at the first rank: from now on every rank has one timeout to
      // arrive (before, the listener's own timeout ran: see the constructor).
      nranks = r.nranks;
      byRank.assign(static_cast<size_t>(nranks), nullptr);
      timer.expires_after(std::chrono::milliseconds(timeoutMs));
      timer.async_wait([this](error_code ec) {
        if (!ec && !done)
          giveUp();
      });
    }
    s->registered = true;
    s->rank = r.rank;
    byRank[r.rank] = s;
    authenticated(s);
    GS_LOG_DEBUG("rendezvous: rank %d of %d registered from %s", r.rank, nranks, s->peer.c_str());
    send(s, wire::frame(MsgType::kStatus, wire::encodeStatus(Errc::kOk, "")));
    readMessage(s, {MsgType::kPayload}, [this, s] { onPayload(s); });
  }

  void onPayload(const SessionPtr& s) {
    s->payload = std::move(s->body);
    s->hasPayload = true;
    ++payloads;
    // Nothing more is expected from this client; a read that ends tells us it went away.
    readMessage(s, {MsgType::kHello}, [this, s] {
      reject(s, Errc::kInvalidArgument, "unexpected message after the payload");
    });
    if (payloads == nranks)
      complete();
  }

  void complete() {
    done = true;
    std::vector<std::span<const uint8_t>> all;
    for (const auto& s : byRank)
      all.emplace_back(s->payload);
    auto result = std::make_shared<const std::vector<uint8_t>>(
        wire::frame(MsgType::kResult, wire::encodeResult(all)));
    GS_LOG_INFO("rendezvous on %s complete: %d ranks", id.endpoint().c_str(), nranks);
    finishAll([&](const SessionPtr& s) {
      if (s->registered)
        return result;
      return status(Errc::kInvalidArgument, "the rendezvous is already over");
    });
  }

  void giveUp() {
    done = true;
    std::vector<int> missing, silent;
    for (int r = 0; r < nranks; ++r) {
      if (!byRank[r]) {
        missing.push_back(r);
      } else if (!byRank[r]->hasPayload) {
        silent.push_back(r);
      }
    }
    std::string message =
        nranks == 0 ? formatString("rendezvous timed out after %lld ms: no rank registered",
                                   static_cast<long long>(timeoutMs))
                    : formatString("rendezvous timed out after %lld ms: %d of %d ranks registered",
                                   static_cast<long long>(timeoutMs),
                                   nranks - static_cast<int>(missing.size()), nranks);
    if (!missing.empty())
      message += "; rank(s) " + formatRanks(missing) + " never arrived";
    if (!silent.empty()) {
      message += "; rank(s) " + formatRanks(silent) + " registered but sent no payload";
    }
    GS_LOG_WARN("rendezvous server on %s: %s", id.endpoint().c_str(), message.c_str());
    auto reply = status(Errc::kTimeout, message);
    finishAll([&](const SessionPtr&) { return reply; });
  }

  // Sends each open session its last message, then closes it; stops accepting.
  template <class LastMessage>
  void finishAll(LastMessage&& last) {
    error_code ignored;
    acceptor.close(ignored);
    timer.cancel();
    std::vector<SessionPtr> open(sessions.begin(), sessions.end());
    for (const auto& s : open) {
      sendShared(s, last(s));
      closeAfterFlush(s);
    }
  }

  static std::shared_ptr<const std::vector<uint8_t>> status(Errc code, const std::string& text) {
    return std::make_shared<const std::vector<uint8_t>>(
        wire::frame(MsgType::kStatus, wire::encodeStatus(code, text)));
  }

  void reject(const SessionPtr& s, Errc code, const std::string& why) {
    if (s->closed)
      return;
    GS_LOG_WARN("rejected rendezvous connection from %s: %s", s->peer.c_str(), why.c_str());
    sendShared(s, status(code, why));
    closeAfterFlush(s);
  }

  void send(const SessionPtr& s, std::vector<uint8_t> bytes) {
    sendShared(s, std::make_shared<const std::vector<uint8_t>>(std::move(bytes)));
  }

  void sendShared(const SessionPtr& s, std::shared_ptr<const std::vector<uint8_t>> bytes) {
    if (s->closed || s->closeWhenFlushed)
      return;
    s->outbox.push_back(std::move(bytes));
    if (!s->writing)
      writeNext(s);
  }

  void writeNext(const SessionPtr& s) {
    s->writing = true;
    asio::async_write(s->socket, asio::buffer(*s->outbox.front()),
                      [this, s](error_code ec, size_t) {
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

  void closeAfterFlush(const SessionPtr& s) {
    s->closeWhenFlushed = true;
    if (!s->writing && s->outbox.empty())
      close(s);
  }

  void onConnectionLost(const SessionPtr& s, const error_code& ec) {
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

  void close(const SessionPtr& s) {
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

  // Connections accepted but not yet registered, at most: beyond it accepting pauses.
  static constexpr int kMaxUnauthenticated = 64;

  Secret secret;
  int64_t timeoutMs;
  int64_t authMs;  // authDeadlineMs(timeoutMs)
  UniqueId id;
  // Declared before everything that holds sockets or handlers, so it is destroyed last.
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer timer;
  std::set<SessionPtr> sessions;   // every open connection
  std::vector<SessionPtr> byRank;  // registered connection per rank (size nranks once known)
  int nranks = 0;                  // 0 until the first registration
  int payloads = 0;
  int unauthenticated = 0;    // sessions with authenticating set
  bool acceptPaused = false;  // acceptNext() found the pool full
  bool done = false;          // result or timeout sent; nothing new is accepted
  std::atomic<bool> finished{false};
  std::mutex stopMutex;
  pid_t creatorPid;
  std::thread thread;
};

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

namespace {

// Servers started for gs_get_unique_id / env launch outlive the call that made them. The
// registry owns them; its destructor (at exit) stops and joins each thread before the statics
// those threads use are gone.
class ServerRegistry {
 public:
  ~ServerRegistry() { shutdown(); }

  void add(std::unique_ptr<RendezvousServer> server) {
    std::vector<std::unique_ptr<RendezvousServer>> finished;
    std::lock_guard<std::mutex> lock(mutex_);
    auto done = std::partition(servers_.begin(), servers_.end(),
                               [](const auto& s) { return !s->finished(); });
    std::move(done, servers_.end(), std::back_inserter(finished));
    servers_.erase(done, servers_.end());
    servers_.push_back(std::move(server));
  }

  void shutdown() {
    std::vector<std::unique_ptr<RendezvousServer>> all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      all.swap(servers_);
    }
    all.clear();  // joins outside the lock
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<RendezvousServer>> servers_;
};

ServerRegistry& registry() {
  static ServerRegistry instance;
  return instance;
}

}  // namespace

UniqueId startRendezvousServer(const std::string& address,
                               uint16_t port,
                               const Secret& secret,
                               const Config& config) {
  auto server = std::make_unique<RendezvousServer>(address, port, secret, config);
  UniqueId id = server->uniqueId();
  registry().add(std::move(server));
  return id;
}

UniqueId createUniqueId(const Config& config) {
  std::string address;
  if (config.socketIfname.empty()) {
    static std::once_flag once;
    std::call_once(once, [] {
      GS_LOG_INFO(
          "GS_SOCKET_IFNAME is unset: the rendezvous listens on 127.0.0.1 only, so only "
          "ranks on this host can join and nothing is exposed to the network");
    });
    address = "127.0.0.1";
  } else {
    address = interfaceAddress(config.socketIfname);
  }
  return startRendezvousServer(address, 0, randomSecret(), config);
}

void shutdownRendezvousServers() {
  registry().shutdown();
}

// ------------------------------------------------------------------------------------------
// Client

struct BootstrapClient::Impl {
  asio::io_context io;
  tcp::socket socket{io};
  std::string server;  // "addr:port", for messages
  int rank = 0;
  int nranks = 0;
  std::string localAddress;
  bool gathered = false;
  Clock::time_point callStart = Clock::now();  // start of the public call, for messages

  [[noreturn]] void throwTimeout(const std::string& doing) const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - callStart);
    throw Error(Errc::kTimeout,
                formatString("rendezvous with %s timed out after %lld ms %s", server.c_str(),
                             static_cast<long long>(ms.count()), doing.c_str()));
  }

  // Runs the io_context until `done` or the deadline. At the deadline it closes the socket
  // (which completes the pending operation with operation_aborted), drains, and returns false.
  bool runUntil(const bool& done, Deadline deadline) {
    io.restart();
    while (!done && !deadline.expired()) {
      io.run_one_until(deadline.at());
      if (io.stopped())
        io.restart();
    }
    if (done)
      return true;
    error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();
    return false;
  }

  void writeAll(const std::vector<uint8_t>& bytes, Deadline deadline, const char* doing) {
    bool done = false;
    error_code ec;
    asio::async_write(socket, asio::buffer(bytes), [&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!runUntil(done, deadline))
      throwTimeout(doing);
    GS_CHECK(!ec, Errc::kRemote, "rendezvous with %s: send failed %s: %s", server.c_str(), doing,
             ec.message().c_str());
  }

  void readExact(uint8_t* data, size_t len, Deadline deadline, const char* doing) {
    bool done = false;
    error_code ec;
    asio::async_read(socket, asio::buffer(data, len), [&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!runUntil(done, deadline))
      throwTimeout(doing);
    GS_CHECK(ec != asio::error::eof, Errc::kRemote,
             "rendezvous with %s: the server closed the connection %s", server.c_str(), doing);
    GS_CHECK(!ec, Errc::kRemote, "rendezvous with %s: receive failed %s: %s", server.c_str(), doing,
             ec.message().c_str());
  }

  // Reads one message of an allowed type. A Status carrying an error is thrown as the server's
  // error; other malformed input becomes kRemote naming the server.
  std::pair<MsgType, std::vector<uint8_t>> readMessage(std::initializer_list<MsgType> allowed,
                                                       Deadline deadline,
                                                       const char* doing) {
    std::array<uint8_t, wire::kHeaderBytes> header{};
    readExact(header.data(), header.size(), deadline, doing);
    wire::Header h{};
    try {
      h = wire::decodeHeader(header.data(), allowed, nranks);
    } catch (const Error& e) {
      throw Error(Errc::kRemote,
                  formatString("rendezvous with %s %s: %s", server.c_str(), doing, e.what()));
    }
    std::vector<uint8_t> body(h.bodyLen);
    readExact(body.data(), body.size(), deadline, doing);
    if (h.type == MsgType::kStatus) {
      auto [code, text] = wire::decodeStatus(body);
      if (code != Errc::kOk) {
        throw Error(code, formatString("rendezvous with %s failed for rank %d of %d: %s",
                                       server.c_str(), rank, nranks, text.c_str()));
      }
    }
    return {h.type, std::move(body)};
  }

  // Connects, retrying while nothing listens (rank 0's server may not exist yet).
  void connectWithRetry(const tcp::endpoint& ep, Deadline deadline) {
    auto backoff = std::chrono::milliseconds(10);
    std::string lastError = "no attempt finished";
    for (;;) {
      if (deadline.expired())
        throwTimeout("connecting (last error: " + lastError + ")");
      // A SYN into a black hole can take minutes to fail; cap each attempt so a server that
      // appears later is still found before the deadline.
      Deadline attempt = deadline.earlier(Deadline::afterMs(2000));
      bool done = false;
      error_code ec;
      socket.async_connect(ep, [&](error_code e) {
        ec = e;
        done = true;
      });
      if (!runUntil(done, attempt)) {
        lastError = "connect attempt timed out";
        continue;
      }
      if (!ec)
        return;
      lastError = ec.message();
      error_code ignored;
      socket.close(ignored);
      std::this_thread::sleep_for(
          std::min<std::chrono::nanoseconds>(backoff, deadline.remaining()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
  }

  void handshake(const Secret& secret, Deadline deadline) {
    wire::Nonce clientNonce = randomNonce();
    writeAll(wire::frame(MsgType::kHello, clientNonce), deadline, "sending hello");
    auto [type, challenge] =
        readMessage({MsgType::kChallenge, MsgType::kStatus}, deadline, "waiting for the challenge");
    GS_CHECK(type == MsgType::kChallenge, Errc::kRemote,
             "rendezvous with %s: expected a challenge, got a status", server.c_str());
    wire::Nonce serverNonce{};
    AuthTag serverTag{};
    std::copy_n(challenge.begin(), serverNonce.size(), serverNonce.begin());
    std::copy_n(challenge.begin() + wire::kNonceBytes, serverTag.size(), serverTag.begin());
    std::vector<uint8_t> serverInput(clientNonce.begin(), clientNonce.end());
    serverInput.insert(serverInput.end(), serverNonce.begin(), serverNonce.end());
    bool serverKnowsSecret = tagsEqual(
        serverTag, authTag(secret, wire::kServerDomain, serverInput.data(), serverInput.size()));

    // Register even when the server's proof failed: the server then logs the rejected peer
    // too, and our tag reveals nothing about our secret.
    auto input = wire::registrationTagInput(serverNonce, rank, nranks);
    wire::Registration reg{rank, nranks,
                           authTag(secret, wire::kClientDomain, input.data(), input.size())};
    writeAll(wire::frame(MsgType::kRegister, wire::encodeRegistration(reg)), deadline,
             "registering");
    // Different secrets make the server's proof fail here, before the server says anything.
    GS_CHECK(serverKnowsSecret, Errc::kInvalidArgument,
             "rendezvous refused: wrong communicator secret (rank %d, server %s): the unique id "
             "or GS_SECRET differs between ranks",
             rank, server.c_str());
    readMessage({MsgType::kStatus}, deadline, "registering");
  }
};

BootstrapClient::BootstrapClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BootstrapClient::BootstrapClient(BootstrapClient&&) noexcept = default;
BootstrapClient& BootstrapClient::operator=(BootstrapClient&&) noexcept = default;
BootstrapClient::~BootstrapClient() = default;

BootstrapClient BootstrapClient::connect(const UniqueId& id,
                                         int rank,
                                         int nranks,
                                         Deadline deadline) {
  GS_CHECK(nranks >= 1 && nranks <= kMaxRendezvousRanks, Errc::kInvalidArgument,
           "nranks %d is out of range (1..%d)", nranks, kMaxRendezvousRanks);
  GS_CHECK(rank >= 0 && rank < nranks, Errc::kInvalidArgument,
           "rank %d is out of range for nranks %d", rank, nranks);
  auto impl = std::make_unique<Impl>();
  impl->server = id.endpoint();
  impl->rank = rank;
  impl->nranks = nranks;
  impl->callStart = Clock::now();
  impl->connectWithRetry(tcp::endpoint(toAsio(id.address), id.port), deadline);
  error_code ec;
  impl->socket.set_option(tcp::no_delay(true), ec);
  impl->handshake(id.secret, deadline);
  auto local = impl->socket.local_endpoint(ec);
  GS_CHECK(!ec, Errc::kSystem, "rendezvous with %s: cannot read the local address: %s",
           impl->server.c_str(), ec.message().c_str());
  impl->localAddress = local.address().to_string();
  GS_LOG_DEBUG("rendezvous: rank %d of %d joined %s from %s", rank, nranks, impl->server.c_str(),
               impl->localAddress.c_str());
  return BootstrapClient(std::move(impl));
}

int BootstrapClient::rank() const {
  return impl_->rank;
}
int BootstrapClient::nranks() const {
  return impl_->nranks;
}
std::string BootstrapClient::localAddress() const {
  return impl_->localAddress;
}

std::vector<std::vector<uint8_t>> BootstrapClient::allgather(std::span<const uint8_t> myPayload,
                                                             Deadline deadline) {
  GS_CHECK(!impl_->gathered, Errc::kInvalidArgument,
           "rendezvous allgather called twice on rank %d (the rendezvous serves one round)",
           impl_->rank);
  GS_CHECK(myPayload.size() <= kMaxRendezvousPayload, Errc::kInvalidArgument,
           "rendezvous payload of rank %d is %zu bytes, more than the %zu allowed", impl_->rank,
           myPayload.size(), kMaxRendezvousPayload);
  impl_->gathered = true;
  impl_->callStart = Clock::now();
  impl_->writeAll(wire::frame(MsgType::kPayload, myPayload), deadline, "sending the payload");
  auto [type, body] = impl_->readMessage({MsgType::kResult, MsgType::kStatus}, deadline,
                                         "waiting for all ranks to arrive");
  GS_CHECK(type == MsgType::kResult, Errc::kRemote,
           "rendezvous with %s: expected the allgather result, got a status",
           impl_->server.c_str());
  std::vector<std::vector<uint8_t>> all;
  try {
    all = wire::decodeResult(body, impl_->nranks);
  } catch (const Error& e) {
    throw Error(Errc::kRemote,
                formatString("rendezvous with %s: %s", impl_->server.c_str(), e.what()));
  }
  GS_CHECK(std::equal(myPayload.begin(), myPayload.end(), all[impl_->rank].begin(),
                      all[impl_->rank].end()),
           Errc::kRemote, "rendezvous with %s: the result holds a different payload for rank %d",
           impl_->server.c_str(), impl_->rank);
  error_code ignored;
  impl_->socket.close(ignored);
  return all;
}

}  // namespace gs::control
