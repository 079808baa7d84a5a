#include "transport/sockets/handshake.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/log.h"

namespace gs::transport::sockets {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

// 4 MiB socket buffers let one socket keep a loopback or datacenter link busy. Linux caps
// setsockopt at net.core.{r,w}mem_max, and a fixed size also switches off receive autotuning,
// so we only ask when the cap allows what we want; otherwise autotuning does better.
constexpr int kSocketBufferBytes = 4 << 20;

int sysctlInt(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f)
    return 0;
  int value = 0;
  if (fscanf(f, "%d", &value) != 1)
    value = 0;
  fclose(f);
  return value;
}

// Poll slice while waiting in set-up: short enough to notice the deadline promptly.
constexpr int kSetupPollMs = 50;

int pollMs(const Deadline& deadline) {
  int left = deadline.remainingMs();
  return left < kSetupPollMs ? (left > 0 ? left : 0) : kSetupPollMs;
}

}  // namespace

std::string endpointText(const asio::ip::tcp::endpoint& ep) {
  error_code ec;
  std::string ip = ep.address().to_string(ec);
  return (ep.address().is_v6() ? "[" + ip + "]" : ip) + ":" + std::to_string(ep.port());
}

void tuneSocket(Socket& socket) {
  static const bool bigBuffers = sysctlInt("/proc/sys/net/core/rmem_max") >= kSocketBufferBytes &&
                                 sysctlInt("/proc/sys/net/core/wmem_max") >= kSocketBufferBytes;
  error_code ec;
  socket.set_option(asio::ip::tcp::no_delay(true), ec);
  if (ec)
    GS_LOG_WARN("tcp: cannot set TCP_NODELAY: %s", ec.message().c_str());
  if (bigBuffers) {
    socket.set_option(asio::socket_base::send_buffer_size(kSocketBufferBytes), ec);
    socket.set_option(asio::socket_base::receive_buffer_size(kSocketBufferBytes), ec);
    if (ec)
      GS_LOG_DEBUG("tcp: cannot size socket buffers: %s", ec.message().c_str());
  }
  socket.non_blocking(true, ec);
  GS_CHECK(!ec, Errc::kSystem, "tcp: cannot make a socket non-blocking: %s", ec.message().c_str());
}

Listener::Listener(asio::io_context& io,
                   const asio::ip::address& bind,
                   const HandshakeParams& params)
    : io_(io), params_(params), acceptor_(io) {
  error_code ec;
  asio::ip::tcp::endpoint ep(bind, 0);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) {
    // Accepted sockets inherit the receive buffer size, and it must be set before the
    // handshake for the TCP window scale to cover it (tcp(7)).
    acceptor_.set_option(asio::socket_base::receive_buffer_size(kSocketBufferBytes), ec);
    ec.clear();
    acceptor_.bind(ep, ec);
  }
  if (!ec)
    acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec)
    acceptor_.non_blocking(true, ec);
  if (!ec)
    endpoint_ = acceptor_.local_endpoint(ec);
  GS_CHECK(!ec, Errc::kSystem, "tcp: cannot listen on %s: %s", bind.to_string().c_str(),
           ec.message().c_str());
}

void Listener::service() {
  // Accept everything waiting in the backlog.
  for (int i = 0; i < 64; ++i) {
    auto pending = std::make_unique<Pending>(io_);
    asio::ip::tcp::endpoint from;
    error_code ec;
    acceptor_.accept(pending->socket, from, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again)
      break;
    if (ec) {
      GS_LOG_WARN("tcp: accept failed: %s", ec.message().c_str());
      break;
    }
    pending->peerIp = from.address().to_string(ec);
    pending->since = Clock::now();
    pending->socket.non_blocking(true, ec);
    if (ec)
      continue;
    pending_.push_back(std::move(pending));
  }
  // Read hellos; a socket leaves pending_ when accepted, rejected, closed or too slow.
  const auto tooOld = Clock::now() - std::chrono::milliseconds(params_.handshakeTimeoutMs);
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = *pending_[i];
    error_code ec;
    size_t n = p.socket.read_some(asio::buffer(p.buffer + p.got, sizeof(Hello) - p.got), ec);
    std::string why;
    bool done = false;
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      if (p.since < tooOld) {
        why = "no hello within the handshake timeout";
        done = true;
      }
    } else if (ec) {
      GS_LOG_DEBUG("tcp: socket from %s closed during the handshake: %s", p.peerIp.c_str(),
                   ec.message().c_str());
      done = true;
    } else {
      p.got += n;
      if (p.got == sizeof(Hello)) {
        why = accept(p);
        done = true;
      }
    }
    if (!why.empty())
      GS_LOG_WARN("rejected %s connection from %s: %s", params_.backend, p.peerIp.c_str(),
                  why.c_str());
    if (done) {
      pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (hook_ && !inHook_) {
    inHook_ = true;
    try {
      hook_();
    } catch (...) {
      inHook_ = false;
      throw;
    }
    inHook_ = false;
  }
}

std::string Listener::accept(Pending& p) {
  Hello hello;
  std::memcpy(&hello, p.buffer, sizeof(hello));
  if (hello.magic != kHelloMagic)
    return "bad magic (not a gradstream peer)";
  if (hello.version != kWireVersion) {
    return formatString("protocol version %u, we speak %u", hello.version, kWireVersion);
  }
  AuthTag expected = authTag(params_.secret, kHelloDomain, &hello, kHelloSignedBytes);
  AuthTag got;
  std::memcpy(got.data(), hello.mac, got.size());
  if (!tagsEqual(expected, got))
    return "authentication failed (wrong communicator secret)";
  if (hello.targetRank != params_.rank) {
    return formatString("hello addressed to rank %d, we are rank %d", hello.targetRank,
                        params_.rank);
  }
  if (hello.dialerRank <= params_.rank || hello.dialerRank >= params_.nranks) {
    return formatString("dialer claims rank %d (only ranks %d..%d dial us)", hello.dialerRank,
                        params_.rank + 1, params_.nranks - 1);
  }
  if (hello.socketCount != params_.socketsPerPeer) {
    return formatString(
        "rank %d uses %u sockets per peer, we use %d (GS_SOCKETS_PER_PEER "
        "must match)",
        hello.dialerRank, hello.socketCount, params_.socketsPerPeer);
  }
  if (hello.socketIndex >= hello.socketCount) {
    return formatString("socket index %u of %u", hello.socketIndex, hello.socketCount);
  }
  auto& slots = stash_[hello.dialerRank];
  slots.resize(static_cast<size_t>(params_.socketsPerPeer));
  if (slots[hello.socketIndex]) {
    return formatString("duplicate socket %u from rank %d", hello.socketIndex, hello.dialerRank);
  }

  Ack ack{kAckMagic, kWireVersion, hello.socketIndex, params_.rank, hello.dialerRank, {}};
  uint8_t signedBytes[kAckSignedBytes + sizeof(hello.mac)];
  std::memcpy(signedBytes, &ack, kAckSignedBytes);
  std::memcpy(signedBytes + kAckSignedBytes, hello.mac, sizeof(hello.mac));
  AuthTag tag = authTag(params_.secret, kAckDomain, signedBytes, sizeof(signedBytes));
  std::memcpy(ack.mac, tag.data(), tag.size());
  // The ack is tiny and the socket fresh, so one non-blocking write takes it whole.
  error_code ec;
  size_t n = p.socket.write_some(asio::buffer(&ack, sizeof(ack)), ec);
  if (ec || n != sizeof(ack)) {
    return formatString("cannot send the ack: %s", ec ? ec.message().c_str() : "short write");
  }
  tuneSocket(p.socket);
  slots[hello.socketIndex] = std::make_unique<Socket>(std::move(p.socket));
  GS_LOG_DEBUG("tcp: accepted socket %u of %u from rank %d (%s)", hello.socketIndex,
               hello.socketCount, hello.dialerRank, p.peerIp.c_str());
  return {};
}

void Listener::appendPollFds(std::vector<pollfd>& fds) const {
  fds.push_back(pollfd{const_cast<asio::ip::tcp::acceptor&>(acceptor_).native_handle(), POLLIN, 0});
  for (const auto& p : pending_) {
    fds.push_back(pollfd{const_cast<Socket&>(p->socket).native_handle(), POLLIN, 0});
  }
}

int Listener::arrived(int peer) const {
  auto it = stash_.find(peer);
  if (it == stash_.end())
    return 0;
  int n = 0;
  for (const auto& s : it->second)
    n += s ? 1 : 0;
  return n;
}

bool Listener::takeAny(int* peer, std::vector<Socket>& out) {
  for (const auto& [rank, sockets] : stash_) {
    if (arrived(rank) == params_.socketsPerPeer) {
      *peer = rank;
      return take(rank, out);
    }
  }
  return false;
}

bool Listener::take(int peer, std::vector<Socket>& out) {
  if (arrived(peer) != params_.socketsPerPeer)
    return false;
  auto it = stash_.find(peer);
  out.clear();
  for (auto& s : it->second)
    out.push_back(std::move(*s));
  stash_.erase(it);
  return true;
}

std::vector<Socket> dial(asio::io_context& io,
                         Listener& listener,
                         const HandshakeParams& params,
                         int peer,
                         const asio::ip::tcp::endpoint& endpoint,
                         Deadline deadline) {
  enum class State { kConnecting, kAwaitAck, kDone };
  struct Dialed {
    explicit Dialed(asio::io_context& ctx) : socket(ctx) {}
    Socket socket;
    State state = State::kConnecting;
    Hello hello{};
    alignas(8) uint8_t ack[sizeof(Ack)];
    size_t got = 0;
  };
  const std::string where = endpointText(endpoint);
  const int count = params.socketsPerPeer;
  std::vector<std::unique_ptr<Dialed>> dialed;

  auto startConnect = [&](Dialed& d) {
    error_code ec;
    if (d.socket.is_open())
      d.socket.close(ec);
    d.socket.open(endpoint.protocol(), ec);
    GS_CHECK(!ec, Errc::kSystem, "tcp: cannot open a socket: %s", ec.message().c_str());
    tuneSocket(d.socket);  // before connect, so the window scale covers the buffer
    // Asio's synchronous connect blocks without a timeout even on a non-blocking socket, so
    // connect(2) is called directly and completion is observed with poll().
    int rc = ::connect(d.socket.native_handle(), endpoint.data(),
                       static_cast<socklen_t>(endpoint.size()));
    GS_CHECK(rc == 0 || errno == EINPROGRESS, Errc::kSystem, "tcp connect to rank %d (%s): %s",
             peer, where.c_str(), strerror(errno));
    d.state = State::kConnecting;
    d.got = 0;
  };
  for (int i = 0; i < count; ++i) {
    auto d = std::make_unique<Dialed>(io);
    d->hello = Hello{kHelloMagic,
                     kWireVersion,
                     static_cast<uint16_t>(i),
                     params.rank,
                     peer,
                     static_cast<uint16_t>(count),
                     0,
                     0,
                     {}};
    AuthTag tag = authTag(params.secret, kHelloDomain, &d->hello, kHelloSignedBytes);
    std::memcpy(d->hello.mac, tag.data(), tag.size());
    startConnect(*d);
    dialed.push_back(std::move(d));
  }

  std::vector<pollfd> fds;
  for (;;) {
    int done = 0;
    for (auto& d : dialed) {
      if (d->state == State::kConnecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        pollfd probe{d->socket.native_handle(), POLLOUT, 0};
        if (::poll(&probe, 1, 0) != 1)
          continue;
        getsockopt(d->socket.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == ECONNREFUSED) {
          // The listener exists before its blob is published, so a refusal means the peer's
          // device is gone or not yet back; keep trying until the deadline.
          GS_CHECK(!deadline.expired(), Errc::kTimeout,
                   "tcp connect to rank %d (%s) timed out: connection refused", peer,
                   where.c_str());
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          startConnect(*d);
          continue;
        }
        GS_CHECK(err == 0, Errc::kRemote, "tcp connect to rank %d (%s): %s", peer, where.c_str(),
                 strerror(err));
        error_code ec;
        size_t n = d->socket.write_some(asio::buffer(&d->hello, sizeof(Hello)), ec);
        GS_CHECK(!ec && n == sizeof(Hello), Errc::kRemote,
                 "tcp connect to rank %d (%s): cannot send the hello: %s", peer, where.c_str(),
                 ec ? ec.message().c_str() : "short write");
        d->state = State::kAwaitAck;
      }
      if (d->state == State::kAwaitAck) {
        error_code ec;
        size_t n = d->socket.read_some(asio::buffer(d->ack + d->got, sizeof(Ack) - d->got), ec);
        if (ec == asio::error::would_block || ec == asio::error::try_again)
          continue;
        GS_CHECK(!ec, Errc::kRemote,
                 "tcp connect to rank %d (%s): the peer closed the connection during the "
                 "handshake (%s); check its log: it rejects peers without the communicator "
                 "secret",
                 peer, where.c_str(), ec.message().c_str());
        d->got += n;
        if (d->got < sizeof(Ack))
          continue;
        Ack ack;
        std::memcpy(&ack, d->ack, sizeof(ack));
        uint8_t signedBytes[kAckSignedBytes + sizeof(d->hello.mac)];
        std::memcpy(signedBytes, &ack, kAckSignedBytes);
        std::memcpy(signedBytes + kAckSignedBytes, d->hello.mac, sizeof(d->hello.mac));
        AuthTag expected = authTag(params.secret, kAckDomain, signedBytes, sizeof(signedBytes));
        AuthTag got;
        std::memcpy(got.data(), ack.mac, got.size());
        bool ok = ack.magic == kAckMagic && ack.version == kWireVersion &&
                  ack.socketIndex == d->hello.socketIndex && ack.acceptorRank == peer &&
                  ack.dialerRank == params.rank && tagsEqual(expected, got);
        if (!ok) {
          GS_LOG_WARN(
              "rejected %s connection to rank %d (%s): invalid ack (wrong communicator "
              "secret?)",
              params.backend, peer, where.c_str());
          throw Error(Errc::kRemote, formatString("%s connect to rank %d (%s): the peer failed "
                                                  "authentication",
                                                  params.backend, peer, where.c_str()));
        }
        d->state = State::kDone;
      }
      if (d->state == State::kDone)
        ++done;
    }
    if (done == count)
      break;
    if (deadline.expired()) {
      throw Error(Errc::kTimeout,
                  formatString("tcp connect to rank %d (%s) timed out: %d of %d sockets "
                               "acknowledged",
                               peer, where.c_str(), done, count));
    }
    // Keep accepting others' hellos while we wait, so no cycle of waiting ranks can form.
    listener.service();
    fds.clear();
    listener.appendPollFds(fds);
    for (auto& d : dialed) {
      if (d->state == State::kConnecting)
        fds.push_back(pollfd{d->socket.native_handle(), POLLOUT, 0});
      if (d->state == State::kAwaitAck)
        fds.push_back(pollfd{d->socket.native_handle(), POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), pollMs(deadline));
  }
  std::vector<Socket> out;
  for (auto& d : dialed)
    out.push_back(std::move(d->socket));
  return out;
}

std::vector<Socket> establish(asio::io_context& io,
                              Listener& listener,
                              const HandshakeParams& params,
                              int peer,
                              const asio::ip::tcp::endpoint& endpoint,
                              Deadline deadline) {
  if (params.rank > peer)
    return dial(io, listener, params, peer, endpoint, deadline);
  std::vector<Socket> sockets;
  std::vector<pollfd> fds;
  const auto start = Clock::now();
  for (;;) {
    listener.service();
    if (listener.take(peer, sockets))
      return sockets;
    if (deadline.expired()) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      throw Error(
          Errc::kTimeout,
          formatString("connect to rank %d (%s) timed out after %lld ms waiting for it "
                       "to dial in (%d of %d sockets arrived)",
                       peer, endpointText(endpoint).c_str(), static_cast<long long>(waited.count()),
                       listener.arrived(peer), params.socketsPerPeer));
    }
    fds.clear();
    listener.appendPollFds(fds);
    ::poll(fds.data(), fds.size(), pollMs(deadline));
  }
}

std::vector<uint8_t> endpointBlob(const asio::ip::tcp::endpoint& ep, int rank) {
  AddressBlob blob{};
  blob.magic = kAddressMagic;
  blob.version = kWireVersion;
  blob.port = ep.port();
  blob.rank = rank;
  if (ep.address().is_v4()) {
    blob.family = 4;
    auto bytes = ep.address().to_v4().to_bytes();
    std::memcpy(blob.address, bytes.data(), bytes.size());
  } else {
    blob.family = 6;
    auto bytes = ep.address().to_v6().to_bytes();
    std::memcpy(blob.address, bytes.data(), bytes.size());
  }
  std::vector<uint8_t> out(sizeof(blob));
  std::memcpy(out.data(), &blob, sizeof(blob));
  return out;
}

asio::ip::tcp::endpoint parseEndpointBlob(std::span<const uint8_t> bytes,
                                          int peer,
                                          const HandshakeParams& params,
                                          const char* backend) {
  AddressBlob blob{};
  GS_CHECK(bytes.size() == sizeof(blob), Errc::kInvalidArgument,
           "%s connect to rank %d: address blob of %zu bytes, expected %zu", backend, peer,
           bytes.size(), sizeof(blob));
  std::memcpy(&blob, bytes.data(), sizeof(blob));
  GS_CHECK(blob.magic == kAddressMagic && blob.version == kWireVersion &&
               (blob.family == 4 || blob.family == 6),
           Errc::kInvalidArgument, "%s connect to rank %d: not an address blob (version %u)",
           backend, peer, blob.version);
  GS_CHECK(blob.rank == peer && peer != params.rank && peer >= 0 && peer < params.nranks,
           Errc::kInvalidArgument, "%s connect: peer %d (blob says rank %d, we are %d of %d)",
           backend, peer, blob.rank, params.rank, params.nranks);
  asio::ip::address address;
  if (blob.family == 4) {
    asio::ip::address_v4::bytes_type b;
    std::memcpy(b.data(), blob.address, b.size());
    address = asio::ip::address_v4(b);
  } else {
    asio::ip::address_v6::bytes_type b;
    std::memcpy(b.data(), blob.address, b.size());
    address = asio::ip::address_v6(b);
  }
  return asio::ip::tcp::endpoint(address, blob.port);
}

}  // namespace gs::transport::sockets
