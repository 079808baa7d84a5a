#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace gs::transport::shm {

/// One POSIX shared-memory object mapped into this process (shm_open + mmap, MAP_SHARED).
/// The creator owns the name: destroying its Segment unlinks it (unless unlinked earlier);
/// an opener only unmaps. Not thread-safe to destroy while another thread reads it.
class Segment {
 public:
  /// Creates `name` (exclusively, mode 0600) with `bytes` of zeroed memory. Throws kSystem
  /// naming the object (and the errno text) when it cannot.
  static std::unique_ptr<Segment> create(const std::string& name, size_t bytes);
  /// Opens an existing object and maps all of it. Returns null when it does not exist (yet);
  /// throws kSystem on other failures.
  static std::unique_ptr<Segment> open(const std::string& name);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  /// Removes the name (the mapping stays valid). Idempotent; creators only.
  void unlink() noexcept;

 private:
  Segment(std::string name, void* data, size_t size, bool owner);

  std::string name_;
  void* data_;
  size_t size_;
  bool owner_;
  bool linked_;
};

}  // namespace gs::transport::shm
