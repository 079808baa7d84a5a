#pragma once

#include <poll.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "transport/device.h"
#include "transport/sockets/handshake.h"
#include "transport/verbs/port_select.h"
#include "transport/verbs/qp_handshake.h"
#include "transport/verbs/registration.h"
#include "transport/verbs/wire.h"
#include "transport/wakeup.h"

namespace gs::transport::verbs {

class Connection;

/// The verbs backend's device: one active port of one RDMA device (GS_IB_HCA, GID auto-selected
/// or GS_IB_GID_INDEX), its protection domain and registration cache, one completion channel
/// for every connection's CQ, the device's async events, and a tcp listener over which peers
/// set up queue pairs (the address blob carries that listener's endpoint; no rdma_cm needed).
///
/// Owned by the communicator; outlives its connections and regions. registerMemory() and
/// interrupt() are thread-safe; connect() and waitForActivity() are called by one thread at a
/// time, the one that uses the connections.
class Device final : public transport::Device {
 public:
  explicit Device(const DeviceOptions& options);
  ~Device() override;

  DeviceProperties properties() const override;
  std::unique_ptr<transport::MemoryRegion> registerMemory(void* data, size_t bytes) override;
  std::vector<uint8_t> address() const override;
  std::unique_ptr<transport::Connection> connect(int peer,
                                                 std::span<const uint8_t> peerAddress,
                                                 Deadline deadline) override;
  void interrupt() override;

  // For connections.
  const SelectedPort& port() const { return port_; }
  const Config& config() const { return config_; }
  int rank() const { return params_.rank; }
  ibv_pd* pd() const { return pd_.get(); }
  ibv_comp_channel* channel() const { return channel_.get(); }
  void detach(Connection* connection);
  /// Reads pending async events (QP fatal, port down, ...) and fails the connections they
  /// concern. Never blocks.
  void serviceAsyncEvents() noexcept;
  /// Live registrations, for tests.
  size_t registrations() const { return cache_->size(); }

 private:
  std::unique_ptr<Connection> awaitPassive(int peer,
                                           const boost::asio::ip::tcp::endpoint& endpoint,
                                           Deadline deadline);
  void progressPassive();
  void drainChannel() noexcept;

  // Set-ups that higher ranks started by dialing us, until connect() collects them.
  struct Passive {
    std::unique_ptr<QpHandshake> handshake;
    bool ready = false;
    Errc errc = Errc::kOk;
    std::string error;
  };

  Config config_;
  sockets::HandshakeParams params_;
  SelectedPort port_;  // owns the device context: declared first, destroyed last
  VerbsPtr<ibv_pd> pd_;
  VerbsPtr<ibv_comp_channel> channel_;
  std::shared_ptr<RegistrationCache> cache_;
  boost::asio::io_context io_;
  std::unique_ptr<sockets::Listener> listener_;
  Wakeup wakeup_;
  // Recursive: a flushed work completion drained inside waitForActivity() reads the async
  // events (which take it again) to say why.
  std::recursive_mutex connectionsMutex_;
  std::vector<Connection*> connections_;
  std::vector<pollfd> pollFds_;  // reused by waitForActivity
  void wait(std::chrono::microseconds maxWait, const Watched& watched) override;
  std::map<int, Passive> passive_;
};

}  // namespace gs::transport::verbs
