#pragma once

#include <poll.h>

#include <chrono>
#include <vector>

namespace gs::transport {

/// The eventfd a device's interrupt() writes and its waitForActivity() polls (tcp, verbs).
/// notify() is thread-safe; the fd lives as long as the object.
class Wakeup {
 public:
  Wakeup();  // throws kSystem when no eventfd can be made
  ~Wakeup();
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  /// The pollfd to put first in a poll set.
  pollfd pollFd() const { return pollfd{fd_, POLLIN, 0}; }
  /// Wakes a thread polling pollFd().
  void notify() noexcept;
  /// Resets the counter after poll reported it readable, so the next wait blocks again.
  void drain() noexcept;

 private:
  int fd_ = -1;
};

/// ppoll(fds, maxWait) with a microsecond timeout (negative: 0). Returns ppoll's result.
int pollFor(std::vector<pollfd>& fds, std::chrono::microseconds maxWait);

}  // namespace gs::transport
