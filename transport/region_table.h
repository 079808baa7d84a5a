#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

#include "transport/memory.h"

namespace gs::transport {

/// The registered regions of one device, by id: what a peer may name as a write target.
/// Shared by the tcp and loopback backends (verbs uses the NIC's rkeys instead).
///
/// Ids are never reused within a table, so a stale RemoteKey names nothing rather than a
/// different buffer. Thread-safe: registration takes the lock exclusively, lookups (the
/// receive path) take it shared and never allocate.
class RegionTable {
 public:
  struct Entry {
    uint8_t* data = nullptr;
    size_t size = 0;
  };

  /// Adds a region and returns its id (never 0).
  uint32_t add(void* data, size_t size);
  void remove(uint32_t id) noexcept;
  /// Looks the id up; false when it is not registered.
  bool find(uint32_t id, Entry* out) const noexcept;

  /// Runs fn(entry) with the table locked shared, so the region cannot be deregistered
  /// meanwhile (loopback copies into the region under it). Returns false if id is unknown.
  template <class Fn>
  bool withRegion(uint32_t id, Fn&& fn) const {
    std::shared_lock lock(mutex_);
    auto it = regions_.find(id);
    if (it == regions_.end())
      return false;
    fn(it->second);
    return true;
  }

  /// The RemoteKey of a region of this table: its id, little-endian, in 4 bytes.
  static RemoteKey keyFor(uint32_t id) noexcept {
    RemoteKey key;
    std::memcpy(key.bytes, &id, sizeof(id));
    key.length = sizeof(id);
    return key;
  }
  /// The id a RemoteKey carries; 0 (never a valid id) when the key is malformed.
  static uint32_t idOf(const RemoteKey& key) noexcept {
    if (key.length != sizeof(uint32_t))
      return 0;
    uint32_t id = 0;
    std::memcpy(&id, key.bytes, sizeof(id));
    return id;
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<uint32_t, Entry> regions_;
  uint32_t nextId_ = 1;
};

/// A region registered in a RegionTable (tcp and loopback devices): the table entry lives as
/// long as this object. Keeps the table alive, not the device, so it may be destroyed in any
/// order relative to peers. Deregistering a region while a peer may still write into it is the
/// caller's error (as with RDMA); ids are never reused, so a late write is rejected, not
/// misdirected. Thread-safe to read.
class TableRegion final : public MemoryRegion {
 public:
  TableRegion(void* data, size_t size, std::shared_ptr<RegionTable> table)
      : MemoryRegion(data, size), table_(std::move(table)), id_(table_->add(data, size)) {}
  ~TableRegion() override { table_->remove(id_); }

  RemoteKey remoteKey() const override { return RegionTable::keyFor(id_); }

 private:
  std::shared_ptr<RegionTable> table_;
  uint32_t id_;
};

}  // namespace gs::transport
