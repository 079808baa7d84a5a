#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gs::transport::shm {

/// One POSIX shared-memory object mapped into this process (shm_open + mmap, MAP_SHARED).
/// The creator owns the name: destroying its Segment unlinks it (unless unlinked earlier);
/// an opener only unmaps, or unlinks explicitly. Pages are reserved at creation (fallocate),
/// so a full /dev/shm is an error then, never a SIGBUS on first touch. Not thread-safe to
/// destroy while another thread reads it.
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
  /// Removes the name (every mapping stays valid). Idempotent.
  void unlink() noexcept;

 private:
  Segment(std::string name, void* data, size_t size, bool owner);

  std::string name_;
  void* data_;
  size_t size_;
  bool owner_;
  bool linked_;
};

/// Names of a device's segments, all under its prefix ("/gs-<pid>-<token>").
std::string controlSegmentName(const std::string& prefix);
std::string regionSegmentName(const std::string& prefix, uint32_t id);
/// A connection's segment: made by the dialer (the higher rank) for the acceptor.
std::string connectionSegmentName(const std::string& dialerPrefix, int acceptorRank);

/// Whether no process with this pid exists (kill(pid, 0) fails with ESRCH). False for this
/// process and for pids <= 0.
bool processGone(int pid) noexcept;

/// Unlinks segments under /dev/shm left by gradstream processes that no longer exist (a
/// crashed rank cannot unlink its own). Returns how many it removed.
int removeStaleSegments() noexcept;

}  // namespace gs::transport::shm
