#pragma once

#include <poll.h>

#include <memory>
#include <mutex>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "transport/device.h"
#include "transport/region_table.h"
#include "transport/sockets/handshake.h"
#include "transport/wakeup.h"

namespace gs::transport::tcp {

class Connection;

/// The tcp backend's device: a listening socket on options.bindAddress, the registered-region
/// table that incoming frames are validated against, and an eventfd for interrupt(). The
/// higher rank of a pair dials, the lower accepts (see transport/sockets/handshake.h). The
/// io_context only provides the sockets; nothing ever runs it, since the data path uses
/// non-blocking calls and waitForActivity() uses poll(2) directly.
///
/// Owned by the communicator; outlives its connections and regions. registerMemory(),
/// interrupt(), attach() and detach() are thread-safe; connect() and waitForActivity() are
/// called by one thread at a time.
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

  /// Connections add and remove themselves so waitForActivity() can poll their sockets.
  void attach(Connection* connection);
  void detach(Connection* connection);

 private:
  sockets::HandshakeParams params_;
  boost::asio::io_context io_;
  std::shared_ptr<RegionTable> regions_;
  std::unique_ptr<sockets::Listener> listener_;
  Wakeup wakeup_;
  std::mutex connectionsMutex_;
  std::vector<Connection*> connections_;
  std::vector<pollfd> pollFds_;  // reused by waitForActivity
  void wait(std::chrono::microseconds maxWait, const Watched& watched) override;
};

}  // namespace gs::transport::tcp
