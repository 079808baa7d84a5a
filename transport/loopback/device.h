#pragma once

#include <memory>

#include "transport/device.h"
#include "transport/loopback/connection.h"
#include "transport/region_table.h"

namespace gs::transport::loopback {

/// In-process transport for multi-rank tests with threads as ranks. Devices with the same
/// options.fabricId find each other through a process-global registry. connect() completes once
/// the peer's device exists (as a tcp dial completes against a listening peer); the first of the
/// two calls creates the shared link and the second claims it. Owned by the communicator; see
/// transport::Device for thread safety. The global registry is mutex-protected, so devices may be
/// created and destroyed concurrently from any threads.
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

 private:
  void wait(std::chrono::microseconds maxWait, const Watched& watched) override;
  int rank_;
  int nranks_;
  uint64_t fabricId_;
  AuthTag proof_;  // a MAC only holders of the secret can produce; compared at pairing
  std::shared_ptr<RegionTable> regions_;
  std::shared_ptr<Activity> activity_;
};

}  // namespace gs::transport::loopback
