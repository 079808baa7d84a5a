#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/clock.h"
#include "common/config.h"
#include "transport/connection.h"
#include "transport/memory.h"

namespace gs::transport {

struct DeviceProperties {
  std::string name;          // "tcp", "loopback", "verbs:mlx5_0:1"
  double bandwidthGbps = 0;  // nominal link speed
  double latencyUs = 0;      // nominal one-way latency
  bool supportsGpuMemory = false;
  bool supportsDmaBuf = false;
  size_t maxWriteBytes = 0;  // largest single postWrite payload
  // Registering memory pins its pages (verbs): a registration kept after the application frees
  // the buffer would let the NIC read pages that no longer belong to it, so callers must not
  // cache registrations of memory they do not own beyond the call that uses them.
  bool registrationPinsMemory = false;
};

/// What a backend needs to open a device for one rank of one communicator.
struct DeviceOptions {
  int rank = 0;
  int nranks = 1;
  Secret secret{};          // peers prove they hold it when connecting
  std::string bindAddress;  // local IP address to listen on (tcp); "127.0.0.1" by default
  uint64_t fabricId = 0;    // loopback: devices with the same id in one process can connect
  Config config;
};

/// One rank's endpoint of a transport: registers memory, publishes an address blob for the
/// rendezvous, and connects to peers' blobs. Thread safety: registerMemory() and interrupt()
/// are thread-safe; connect() and waitForActivity() are called by one thread at a time.
/// Owned by the communicator; outlives its connections and memory regions.
class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceProperties properties() const = 0;

  /// Registers [data, data + bytes) for use as a write source or target. Throws on failure.
  virtual std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t bytes) = 0;

  /// Allocates `bytes` of zeroed, page-aligned memory a peer can write into, registered: the
  /// region owns the memory and frees it on destruction. Backends whose peers cannot reach
  /// ordinary process memory (shm: another process maps it) override this; the default is
  /// heap pages plus registerMemory().
  virtual std::unique_ptr<MemoryRegion> allocateRegion(size_t bytes);

  /// Opaque blob that peers pass to connect() to reach this device.
  virtual std::vector<uint8_t> address() const = 0;

  /// Connects to peer (both sides call it, each with the other's blob). Blocks until the
  /// connection is authenticated and ready or the deadline passes (kTimeout naming the peer).
  virtual std::unique_ptr<Connection> connect(int peer,
                                              std::span<const uint8_t> peerAddress,
                                              Deadline deadline) = 0;

  /// Which connections' news may end a wait: every one, or those listed.
  struct Watched {
    std::span<const Connection* const> list;
    bool all = true;
    bool operator()(const Connection* c) const {
      return all || std::find(list.begin(), list.end(), c) != list.end();
    }
  };

  /// Blocks until some connection of this device may have progress to make, interrupt() is
  /// called, or maxWait passes. Spurious returns are allowed.
  void waitForActivity(std::chrono::microseconds maxWait) { wait(maxWait, Watched{}); }

  /// Like waitForActivity(), but only news on `watched` (or interrupt()) ends the wait early.
  /// For a caller that can progress on those connections alone (a collective waiting on its
  /// own links): news it will not read until a later call (a credit return on a link the next
  /// schedules do not use) would otherwise end every wait at once, and the rank that should
  /// sleep spins, taking the core from the peer it waits for where ranks outnumber cores.
  void waitForActivityOn(std::chrono::microseconds maxWait,
                         std::span<const Connection* const> watched) {
    wait(maxWait, Watched{watched, false});
  }

  /// Wakes a thread blocked in waitForActivity(). Callable from any thread.
  virtual void interrupt() = 0;

 protected:
  /// Both waits. A backend whose news is level-triggered (a readable socket, a queued item)
  /// must look at the connections `watched` accepts only; one that wakes once per event
  /// (loopback's flag) may ignore it.
  virtual void wait(std::chrono::microseconds maxWait, const Watched& watched) = 0;
};

/// Opens the named backend ("tcp", "loopback"). Throws kUnsupported for a backend not built in
/// or not usable on this machine, kInvalidArgument for an unknown name.
std::unique_ptr<Device> createDevice(const std::string& name, const DeviceOptions& options);

/// Whether two devices of the named backend, known by their address blobs
/// (Device::address()), can reach each other through memory shared on one host (for "shm": the
/// same boot, pid namespace and /dev/shm, both ways). False for backends that are not
/// same-host ones and for malformed blobs. The control plane picks shm for a peer with this.
bool sameHostReachable(const std::string& name,
                       std::span<const uint8_t> a,
                       std::span<const uint8_t> b);

/// Resolves "auto" to the best backend available here (verbs where an active RDMA port that
/// config allows exists, else tcp), logging the choice and why once.
std::string resolveTransportName(const std::string& requested, const Config& config);

}  // namespace gs::transport
