#include "transport/wakeup.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace gs::transport {

Wakeup::Wakeup() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  GS_CHECK_ERRNO(fd_);
}

Wakeup::~Wakeup() {
  ::close(fd_);
}

void Wakeup::notify() noexcept {
  const uint64_t one = 1;
  if (::write(fd_, &one, sizeof(one)) < 0 && errno != EAGAIN)
    GS_LOG_WARN("transport: interrupt failed: %s", strerror(errno));
}

void Wakeup::drain() noexcept {
  uint64_t value;
  // EAGAIN: another thread drained it already.
  if (::read(fd_, &value, sizeof(value)) < 0 && errno != EAGAIN)
    GS_LOG_DEBUG("transport: eventfd read failed: %s", strerror(errno));
}

int pollFor(std::vector<pollfd>& fds, std::chrono::microseconds maxWait) {
  if (maxWait.count() < 0)
    maxWait = std::chrono::microseconds(0);
  timespec ts{static_cast<time_t>(maxWait.count() / 1000000),
              static_cast<long>(maxWait.count() % 1000000) * 1000};
  return ::ppoll(fds.data(), fds.size(), &ts, nullptr);
}

}  // namespace gs::transport
