// How a pair of ranks gets its authenticated sockets: the higher rank dials (Dialer, below),
// the lower waits for them to arrive at its Listener (handshake.cc), which accepts and acks
// them. Every wait polls in short slices against the caller's deadline.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "transport/sockets/handshake.h"

namespace gs::transport::sockets {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

// Poll slice while waiting in set-up: short enough to notice the deadline promptly.
constexpr int kSetupPollMs = 50;

int pollMs(const Deadline& deadline) {
  int left = deadline.remainingMs();
  return left < kSetupPollMs ? (left > 0 ? left : 0) : kSetupPollMs;
}

// The dialing side of connection set-up: the counterpart of Listener (handshake.cc), one state
// machine per socket, with one function per transition.
//
//   (new socket)  --dial(): a non-blocking connect(2) started-->             kConnecting
//   kConnecting   --connected(): connect(2) finished, the hello sent-->       kAwaitingAck
//   kConnecting   --connected(): refused before the deadline, dial() again--> kConnecting
//   kAwaitingAck  --ackArrived(): the whole ack is here and authentic-->      kAcknowledged
//
// Every other outcome throws. run() advances every socket as far as it goes, then services the
// listener and polls for at most a slice of the deadline, until all sockets are acknowledged
// (or throws kTimeout at the deadline).
class Dialer {
 public:
  Dialer(asio::io_context& io,
         Listener& listener,
         const HandshakeParams& params,
         int peer,
         const asio::ip::tcp::endpoint& endpoint,
         Deadline deadline)
      : listener_(listener),
        params_(params),
        peer_(peer),
        endpoint_(endpoint),
        deadline_(deadline),
        where_(endpointText(endpoint)) {
    const int count = params_.socketsPerPeer;
    for (int i = 0; i < count; ++i) {
      auto d = std::make_unique<Dialed>(io);
      d->hello = Hello{kHelloMagic,
                       kWireVersion,
                       static_cast<uint16_t>(i),
                       params_.rank,
                       peer_,
                       static_cast<uint16_t>(count),
                       0,
                       0,
                       {}};
      AuthTag tag = authTag(params_.secret, kHelloDomain, &d->hello, kHelloSignedBytes);
      std::memcpy(d->hello.mac, tag.data(), tag.size());
      dial(*d);
      dialed_.push_back(std::move(d));
    }
  }

  std::vector<Socket> run() {
    for (;;) {
      int acknowledged = 0;
      for (auto& d : dialed_) {
        if (d->state == State::kConnecting && !connected(*d))
          continue;
        if (d->state == State::kAwaitingAck && !ackArrived(*d))
          continue;
        ++acknowledged;
      }
      if (acknowledged == params_.socketsPerPeer)
        break;
      if (deadline_.expired()) {
        throw Error(Errc::kTimeout,
                    formatString("tcp connect to rank %d (%s) timed out: %d of %d sockets "
                                 "acknowledged",
                                 peer_, where_.c_str(), acknowledged, params_.socketsPerPeer));
      }
      waitForActivity();
    }
    std::vector<Socket> out;
    for (auto& d : dialed_)
      out.push_back(std::move(d->socket));
    return out;
  }

 private:
  enum class State { kConnecting, kAwaitingAck, kAcknowledged };
  struct Dialed {
    explicit Dialed(asio::io_context& ctx) : socket(ctx) {}
    Socket socket;
    State state = State::kConnecting;
    Hello hello{};
    alignas(8) uint8_t ack[sizeof(Ack)];
    size_t got = 0;
  };

  // (Re)opens d's socket and starts a non-blocking connect: -> kConnecting.
  void dial(Dialed& d) {
    error_code ec;
    if (d.socket.is_open())
      d.socket.close(ec);
    d.socket.open(endpoint_.protocol(), ec);
    GS_CHECK(!ec, Errc::kSystem, "tcp: cannot open a socket: %s", ec.message().c_str());
    tuneSocket(d.socket);  // before connect, so the window scale covers the buffer
    // Asio's synchronous connect blocks without a timeout even on a non-blocking socket, so
    // connect(2) is called directly and completion is observed with poll().
    int rc = ::connect(d.socket.native_handle(), endpoint_.data(),
                       static_cast<socklen_t>(endpoint_.size()));
    GS_CHECK(rc == 0 || errno == EINPROGRESS, Errc::kSystem, "tcp connect to rank %d (%s): %s",
             peer_, where_.c_str(), strerror(errno));
    d.state = State::kConnecting;
    d.got = 0;
  }

  // kConnecting: once connect(2) has finished, sends the hello -> kAwaitingAck (true). A refusal
  // dials again; false while still connecting.
  bool connected(Dialed& d) {
    int err = 0;
    socklen_t len = sizeof(err);
    pollfd probe{d.socket.native_handle(), POLLOUT, 0};
    if (::poll(&probe, 1, 0) != 1)
      return false;
    getsockopt(d.socket.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == ECONNREFUSED) {
      // The listener exists before its blob is published, so a refusal means the peer's
      // device is gone or not yet back; keep trying until the deadline.
      GS_CHECK(!deadline_.expired(), Errc::kTimeout,
               "tcp connect to rank %d (%s) timed out: connection refused", peer_, where_.c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      dial(d);
      return false;
    }
    GS_CHECK(err == 0, Errc::kRemote, "tcp connect to rank %d (%s): %s", peer_, where_.c_str(),
             strerror(err));
    error_code ec;
    size_t n = d.socket.write_some(asio::buffer(&d.hello, sizeof(Hello)), ec);
    GS_CHECK(!ec && n == sizeof(Hello), Errc::kRemote,
             "tcp connect to rank %d (%s): cannot send the hello: %s", peer_, where_.c_str(),
             ec ? ec.message().c_str() : "short write");
    d.state = State::kAwaitingAck;
    return true;
  }

  // kAwaitingAck: reads what has arrived of the ack; once it is whole and authentic ->
  // kAcknowledged (true). Throws when the peer closed the socket or the ack is not valid.
  bool ackArrived(Dialed& d) {
    error_code ec;
    size_t n = d.socket.read_some(asio::buffer(d.ack + d.got, sizeof(Ack) - d.got), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again)
      return false;
    GS_CHECK(!ec, Errc::kRemote,
             "tcp connect to rank %d (%s): the peer closed the connection during the "
             "handshake (%s); check its log: it rejects peers without the communicator "
             "secret",
             peer_, where_.c_str(), ec.message().c_str());
    d.got += n;
    if (d.got < sizeof(Ack))
      return false;
    if (!ackIsAuthentic(d)) {
      GS_LOG_WARN(
          "rejected %s connection to rank %d (%s): invalid ack (wrong communicator "
          "secret?)",
          params_.backend, peer_, where_.c_str());
      throw Error(Errc::kRemote, formatString("%s connect to rank %d (%s): the peer failed "
                                              "authentication",
                                              params_.backend, peer_, where_.c_str()));
    }
    d.state = State::kAcknowledged;
    return true;
  }

  // The ack answers d's hello (the mac covers the hello's mac), from peer, to us.
  bool ackIsAuthentic(const Dialed& d) const {
    Ack ack;
    std::memcpy(&ack, d.ack, sizeof(ack));
    uint8_t signedBytes[kAckSignedBytes + sizeof(d.hello.mac)];
    std::memcpy(signedBytes, &ack, kAckSignedBytes);
    std::memcpy(signedBytes + kAckSignedBytes, d.hello.mac, sizeof(d.hello.mac));
    AuthTag expected = authTag(params_.secret, kAckDomain, signedBytes, sizeof(signedBytes));
    AuthTag got;
    std::memcpy(got.data(), ack.mac, got.size());
    return ack.magic == kAckMagic && ack.version == kWireVersion &&
           ack.socketIndex == d.hello.socketIndex && ack.acceptorRank == peer_ &&
           ack.dialerRank == params_.rank && tagsEqual(expected, got);
  }

  // Waits (at most a poll slice) for any of our sockets to move, servicing the listener first.
  void waitForActivity() {
    // Keep accepting others' hellos while we wait, so no cycle of waiting ranks can form.
    listener_.service();
    fds_.clear();
    listener_.appendPollFds(fds_);
    for (auto& d : dialed_) {
      if (d->state == State::kConnecting)
        fds_.push_back(pollfd{d->socket.native_handle(), POLLOUT, 0});
      if (d->state == State::kAwaitingAck)
        fds_.push_back(pollfd{d->socket.native_handle(), POLLIN, 0});
    }
    ::poll(fds_.data(), fds_.size(), pollMs(deadline_));
  }

  Listener& listener_;
  const HandshakeParams& params_;
  const int peer_;
  const asio::ip::tcp::endpoint& endpoint_;
  const Deadline deadline_;
  const std::string where_;
  std::vector<std::unique_ptr<Dialed>> dialed_;
  std::vector<pollfd> fds_;
};

}  // namespace

std::vector<Socket> dial(asio::io_context& io,
                         Listener& listener,
                         const HandshakeParams& params,
                         int peer,
                         const asio::ip::tcp::endpoint& endpoint,
                         Deadline deadline) {
  return Dialer(io, listener, params, peer, endpoint, deadline).run();
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

}  // namespace gs::transport::sockets
