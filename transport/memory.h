#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gs::transport {

/// Serialized handle that lets a peer write into a MemoryRegion (an rkey plus address for
/// verbs, a region id for tcp and loopback). Fixed size, trivially copyable: it travels in
/// connection set-up blobs and is used on the data path without allocation.
struct RemoteKey {
  static constexpr size_t kMaxBytes = 32;
  uint8_t bytes[kMaxBytes] = {};
  uint8_t length = 0;
};

/// A registered range of memory that a Connection may read from (local segments) or that a
/// peer may write into (through its RemoteKey). Owns the registration, not the memory: the
/// memory must outlive the region. Destruction deregisters; it never throws. The device that
/// created the region must outlive it. Thread-safe to read from any thread.
class MemoryRegion {
 public:
  MemoryRegion(void* data, size_t size) : data_(data), size_(size) {}
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  virtual RemoteKey remoteKey() const = 0;
  /// The region that carries the backend's registration: this one, unless it wraps another
  /// (memory owned by the region, Device::allocateRegion). Backends read their keys from it.
  virtual const MemoryRegion& registered() const { return *this; }

 private:
  void* data_;
  size_t size_;
};

/// A piece of a registered region used as the source of a write or the target of a receive.
struct LocalSegment {
  const MemoryRegion* region = nullptr;
  size_t offset = 0;
  size_t length = 0;
  const uint8_t* data() const { return static_cast<const uint8_t*>(region->data()) + offset; }
};

}  // namespace gs::transport
