// The accepting side of the socket handshake (Listener: reads hellos, checks them, acks),
// the socket options both sides use, and the address blob published through the rendezvous.
// The dialing side and establish() are in establish.cc.
#include "transport/sockets/handshake.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstring>

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
