#pragma once

// The authenticated socket set-up that both socket-based backends use: tcp opens its data sockets
// with it, verbs the side channel over which it exchanges queue pairs (and keeps open as a
// liveness channel). It lives here, not in either backend, so neither includes the other's
// private headers. Messages about the peer's verdict name HandshakeParams::backend; those about
// the sockets themselves say "tcp", the protocol they speak whichever backend asked.
// Implemented in handshake.cc (Listener, tuneSocket, the address blob) and establish.cc (dial,
// establish).

#include <poll.h>

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "common/auth.h"
#include "common/clock.h"
#include "transport/sockets/handshake_wire.h"

namespace gs::transport::sockets {

using Socket = boost::asio::ip::tcp::socket;

/// What both ends of a handshake must agree on.
struct HandshakeParams {
  int rank = 0;
  int nranks = 1;
  int socketsPerPeer = 1;
  Secret secret{};
  int64_t handshakeTimeoutMs = 60000;  // a dialed-in socket must say hello within this
  const char* backend = "tcp";         // names the transport in log lines and errors
};

/// Applies the data-path socket options (TCP_NODELAY, buffer sizes); logs and carries on when
/// the kernel refuses one, since they are tuning, not correctness.
void tuneSocket(Socket& socket);

/// The listening side of connection set-up. Accepts sockets, authenticates their hellos, acks
/// them and stashes them by dialer rank until connect() for that rank collects them. It accepts
/// hellos from any peer while a connect() waits for a particular one, so ranks may connect in
/// any order without deadlock. Owned by the Device; called only from connect() (one thread).
class Listener {
 public:
  Listener(boost::asio::io_context& io,
           const boost::asio::ip::address& bind,
           const HandshakeParams& params);

  boost::asio::ip::tcp::endpoint endpoint() const { return endpoint_; }

  /// Accepts what is pending and advances handshakes. Never blocks.
  void service();
  /// Adds the listener and the sockets still in handshake to a poll set.
  void appendPollFds(std::vector<pollfd>& fds) const;
  /// How many sockets of peer have been authenticated so far.
  int arrived(int peer) const;
  /// Moves out peer's sockets, ordered by socket index, once all have arrived.
  bool take(int peer, std::vector<Socket>& out);
  /// Like take(), for whichever peer has all its sockets here; sets *peer.
  bool takeAny(int* peer, std::vector<Socket>& out);
  /// Runs hook at the end of every service() (not re-entered): a backend whose connection
  /// set-up continues past the sockets (verbs) advances the set-ups peers started with us there,
  /// so ranks blocked in connect() for other peers still answer them.
  void setServiceHook(std::function<void()> hook) { hook_ = std::move(hook); }

 private:
  struct Pending {
    explicit Pending(boost::asio::io_context& io) : socket(io) {}
    Socket socket;
    Hello* hello() { return reinterpret_cast<Hello*>(buffer); }
    alignas(8) uint8_t buffer[sizeof(Hello)];
    size_t got = 0;
    std::string peerIp;
    Clock::time_point since;
  };
  // Validates a complete hello; on success acks and stashes the socket. Returns why it was
  // rejected, or an empty string.
  std::string accept(Pending& pending);

  boost::asio::io_context& io_;
  HandshakeParams params_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::ip::tcp::endpoint endpoint_;
  std::vector<std::unique_ptr<Pending>> pending_;
  std::map<int, std::vector<std::unique_ptr<Socket>>> stash_;  // by dialer rank, by index
  std::function<void()> hook_;
  bool inHook_ = false;
};

/// Dials peer (a lower rank) at endpoint with params.socketsPerPeer sockets, sends the hellos
/// and waits for authenticated acks, servicing listener meanwhile. Throws kTimeout at the
/// deadline and kRemote when the peer refuses us or fails authentication.
std::vector<Socket> dial(boost::asio::io_context& io,
                         Listener& listener,
                         const HandshakeParams& params,
                         int peer,
                         const boost::asio::ip::tcp::endpoint& endpoint,
                         Deadline deadline);

/// Sets up params.socketsPerPeer authenticated sockets with peer: the higher rank of the pair
/// dials (dial()), the lower waits for them to arrive at listener. Throws kTimeout naming the
/// peer at the deadline. `where` names the peer's endpoint in messages.
std::vector<Socket> establish(boost::asio::io_context& io,
                              Listener& listener,
                              const HandshakeParams& params,
                              int peer,
                              const boost::asio::ip::tcp::endpoint& endpoint,
                              Deadline deadline);

/// The listener's endpoint and rank as a 32-byte AddressBlob (handshake_wire.h), for the
/// rendezvous.
std::vector<uint8_t> endpointBlob(const boost::asio::ip::tcp::endpoint& endpoint, int rank);
/// Parses and validates peer's AddressBlob (bytes from the rendezvous are untrusted): size,
/// magic, version, family, and that it names `peer`, which is neither us nor out of range.
/// Throws kInvalidArgument naming `backend` and the peer.
boost::asio::ip::tcp::endpoint parseEndpointBlob(std::span<const uint8_t> blob,
                                                 int peer,
                                                 const HandshakeParams& params,
                                                 const char* backend);
/// "ip:port" or "[ip6]:port".
std::string endpointText(const boost::asio::ip::tcp::endpoint& endpoint);

}  // namespace gs::transport::sockets
