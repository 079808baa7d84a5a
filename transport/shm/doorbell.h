#pragma once

#include <chrono>
#include <cstdint>

#include "transport/shm/wire.h"

namespace gs::transport::shm {

/// The futex doorbell of a device's control segment (process-shared, so not FUTEX_PRIVATE).
///
/// A sleeper announces itself (waiters + 1), reads the doorbell, checks its queues and only
/// then sleeps while the doorbell still reads the same; a ringer publishes its work, then
/// reads waiters and bumps + wakes only when someone may sleep. Both sides put a full fence
/// between their write and their read, so either the ringer sees the sleeper or the sleeper
/// sees the work: no wake-up is lost, and a ring with nobody asleep costs no system call.

/// Rings the doorbell of the device owning `block` (call after publishing work for it).
void ring(ControlBlock& block) noexcept;
/// Bumps and wakes unconditionally (interrupt()).
void ringAlways(ControlBlock& block) noexcept;

/// Announces a sleeper; returns the doorbell value to pass to sleepUntilRung().
uint32_t prepareToSleep(ControlBlock& block) noexcept;
/// Sleeps until the doorbell moves from `seen` or maxWait passes, then retracts the sleeper.
/// With skip (news was found after prepareToSleep()), only retracts.
void sleepUntilRung(ControlBlock& block,
                    uint32_t seen,
                    std::chrono::microseconds maxWait,
                    bool skip) noexcept;

}  // namespace gs::transport::shm
