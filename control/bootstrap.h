#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/clock.h"
#include "common/config.h"
#include "control/unique_id.h"

// Rendezvous: how the ranks of a communicator find each other and exchange their transport
// address blobs before any data connection exists.
//
// Rank 0's process runs a RendezvousServer (a TCP listener on its own thread); every rank,
// rank 0 included, is a BootstrapClient of it. A client proves it holds the communicator
// secret by answering a challenge (and checks that the server holds it too), registers its
// rank, sends one payload, and receives every rank's payload once all ranks have sent theirs.
// Then the server exits. Bytes from the network are untrusted on both sides: every message is
// framed with magic, version, type and a bounded length, and validated before use.

namespace gs::control {

/// Largest payload one rank may contribute to the allgather.
constexpr size_t kMaxRendezvousPayload = 64 * 1024;
/// Largest communicator the rendezvous accepts.
constexpr int kMaxRendezvousRanks = 1 << 16;

/// Rank 0's rendezvous server. Owns its listening socket, the connections it accepted and one
/// thread (Boost.Asio), which is the only thread touching that state. It serves exactly one
/// rendezvous: after it has sent every rank the allgather result, or after Config::timeoutMs
/// counted from the first successful registration (closing all clients with an error that names
/// the ranks that never arrived), it closes everything and its thread ends.
/// The public methods are thread-safe; the destructor stops and joins the thread.
class RendezvousServer {
 public:
  /// Binds address:port (port 0: ephemeral; SO_REUSEADDR so a restarted job can rebind a fixed
  /// port in TIME_WAIT) and starts serving. Throws kInvalidArgument for a bad address, kSystem
  /// naming the endpoint when it cannot bind.
  RendezvousServer(const std::string& address,
                   uint16_t port,
                   const Secret& secret,
                   const Config& config);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  /// The address, bound port and secret, ready for clients.
  UniqueId uniqueId() const;
  /// True once the thread has ended (rendezvous complete, timed out, or stopped).
  bool finished() const;
  /// Stops serving (closing connections without a reply) and joins the thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// For gs_get_unique_id: starts a server on GS_SOCKET_IFNAME's address (config.socketIfname)
/// or, when that is unset, on 127.0.0.1, on an ephemeral port with a fresh random secret, and
/// keeps it in a process-global registry until it finishes or the process exits.
UniqueId createUniqueId(const Config& config);

/// For launch from the environment: starts a server on address:port with the given secret and
/// keeps it in the same registry. Returns the id clients connect with.
UniqueId startRendezvousServer(const std::string& address,
                               uint16_t port,
                               const Secret& secret,
                               const Config& config);

/// Stops and joins every server in the registry. Runs by itself at process exit; callable
/// earlier (tests, library unload).
void shutdownRendezvousServers();

/// One rank's connection to the rendezvous server. Owns the socket and a private io_context;
/// not thread-safe (one thread uses it at a time). Movable.
class BootstrapClient {
 public:
  /// Connects to the server named by `id`, retrying while nothing listens there yet (rank 0 may
  /// start later), authenticates, and registers `rank` of `nranks`. Throws:
  ///   kTimeout "rendezvous with <addr:port> timed out after N ms ..." at the deadline;
  ///   kInvalidArgument "rendezvous refused: wrong communicator secret" when the secrets differ;
  ///   the server's code and message when it refuses the registration (duplicate rank, nranks
  ///   mismatch, rendezvous already complete ...).
  static BootstrapClient connect(const UniqueId& id, int rank, int nranks, Deadline deadline);

  BootstrapClient(BootstrapClient&&) noexcept;
  BootstrapClient& operator=(BootstrapClient&&) noexcept;
  ~BootstrapClient();

  int rank() const;
  int nranks() const;
  /// The local IP of the socket that reaches rank 0's server: the address other ranks can reach
  /// this one at, so the transport listens there (in another network namespace or on a
  /// multi-homed host this is this rank's own interface, not rank 0's).
  std::string localAddress() const;

  /// Sends this rank's payload (<= kMaxRendezvousPayload bytes) and returns every rank's
  /// payload indexed by rank, once all have arrived. Call at most once. Throws kTimeout at the
  /// deadline, or the server's error (e.g. kTimeout naming the ranks that never arrived), or
  /// kRemote when the server sends something malformed or closes the connection.
  std::vector<std::vector<uint8_t>> allgather(std::span<const uint8_t> myPayload,
                                              Deadline deadline);

 private:
  struct Impl;
  explicit BootstrapClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gs::control
