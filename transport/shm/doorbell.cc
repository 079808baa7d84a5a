#include "transport/shm/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace gs::transport::shm {
namespace {

void wakeAll(uint32_t* word) noexcept {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

void ringAlways(ControlBlock& block) noexcept {
  std::atomic_ref<uint32_t>(block.doorbell).fetch_add(1, std::memory_order_seq_cst);
  wakeAll(&block.doorbell);
}

void ring(ControlBlock& block) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(block.waiters).load(std::memory_order_relaxed) != 0)
    ringAlways(block);
}

uint32_t prepareToSleep(ControlBlock& block) noexcept {
  std::atomic_ref<uint32_t>(block.waiters).fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return std::atomic_ref<uint32_t>(block.doorbell).load(std::memory_order_acquire);
}

void sleepUntilRung(ControlBlock& block,
                    uint32_t seen,
                    std::chrono::microseconds maxWait,
                    bool skip) noexcept {
  if (!skip && maxWait.count() > 0) {
    timespec timeout{};
    timeout.tv_sec = static_cast<time_t>(maxWait.count() / 1000000);
    timeout.tv_nsec = static_cast<long>(maxWait.count() % 1000000) * 1000;
    // EAGAIN (already rung), EINTR and ETIMEDOUT all just return: the caller polls anyway.
    syscall(SYS_futex, &block.doorbell, FUTEX_WAIT, seen, &timeout, nullptr, 0);
  }
  std::atomic_ref<uint32_t>(block.waiters).fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace gs::transport::shm
