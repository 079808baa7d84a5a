#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "transport/device.h"
#include "transport/shm/segment.h"
#include "transport/shm/wire.h"

namespace gs::transport::shm {

class Connection;

/// Whether two shm address blobs (Device::address()) come from one shared-memory domain: the
/// same boot of the same machine, one pid namespace and one /dev/shm. Ranks whose blobs are
/// can connect over shm; the communicator uses it (with equal host names) to pick shm for a
/// peer. Malformed blobs are in no domain (false).
bool sameDomain(std::span<const uint8_t> a, std::span<const uint8_t> b);

/// The shm backend's device: ranks that are processes (or threads) of one host exchange
/// chunks through POSIX shared memory. Receive regions (allocateRegion) are shared segments
/// the peer maps; a write is the sender's single memcpy into them plus a notification in the
/// connection's shared queue. Where the kernel lets ranks read each other's memory
/// (process_vm_readv, probed per peer at connect), large raw chunks skip that memcpy: the
/// receiver copies them out of the sender's buffer (Connection::readPeerMemory). Waiting uses a
/// futex doorbell in this device's control segment, which peers ring after queueing work;
/// interrupt() rings it too. A peer that exits is noticed through its pid (pidfd), one that closes
/// through its half of the connection.
///
/// Owned by the communicator; outlives its connections and regions. registerMemory(),
/// allocateRegion() and interrupt() are thread-safe; connect() and waitForActivity() are
/// called by one thread at a time.
class Device final : public transport::Device {
 public:
  explicit Device(const DeviceOptions& options);
  ~Device() override;

  DeviceProperties properties() const override;
  std::unique_ptr<transport::MemoryRegion> registerMemory(void* data, size_t bytes) override;
  std::unique_ptr<transport::MemoryRegion> allocateRegion(size_t bytes) override;
  std::vector<uint8_t> address() const override;
  std::unique_ptr<transport::Connection> connect(int peer,
                                                 std::span<const uint8_t> peerAddress,
                                                 Deadline deadline) override;
  void interrupt() override;

  /// Connections add and remove themselves so waitForActivity() can look at their queues.
  void attach(Connection* connection);
  void detach(Connection* connection);

 private:
  ControlBlock& control() const;
  void wait(std::chrono::microseconds maxWait, const Watched& watched) override;

  int rank_;
  int nranks_;
  Secret secret_;
  std::string prefix_;   // "/gs-<pid>-<random>": every segment this device creates starts so
  uint64_t token_ = 0;   // random, in our blob and control segment: proves the segment is ours
  bool singleCopy_;      // Config::shmSingleCopy: peers may read our memory, and we theirs
  AddressBlob address_;  // what address() publishes, made once
  std::unique_ptr<Segment> control_;  // our doorbell, which peers ring
  std::atomic<uint32_t> nextRegionId_{1};
  std::atomic<bool> interrupted_{false};
  std::mutex connectionsMutex_;
  std::vector<Connection*> connections_;
};

}  // namespace gs::transport::shm
