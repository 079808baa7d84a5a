#pragma once

// Durations of calls too short for a pair of clock_gettime reads: a 1-rank collective takes
// ~100 ns, of which two vDSO reads of the steady clock took a third (17 ns each on the
// reference VM) against 8 ns for the CPU's time-stamp counter. The counter is used only where
// the kernel keeps time with it itself (clocksource "tsc": constant rate, synchronized across
// CPUs), its rate measured once against the steady clock; elsewhere (another clocksource,
// another architecture) the steady clock. now() and ticksToNs() time durations; steadyNow()
// gives steady-clock time points (deadlines, request and call times) anchored to the steady
// clock once a millisecond.

#include <chrono>
#include <cstdint>
#include <string>

namespace gs::cycle {

/// A reading; only differences of two mean anything (ticksToNs).
uint64_t now() noexcept;
/// Nanoseconds in `ticks` (a difference of two now() readings).
uint64_t ticksToNs(uint64_t ticks) noexcept;
/// Whether now() reads the time-stamp counter (false: the steady clock, 1 tick = 1 ns).
bool usesTimeStampCounter() noexcept;
/// Whether a kernel clocksource name (/sys/devices/system/clocksource/clocksource0/
/// current_clocksource, trailing newline allowed) means the counter is safe to time with.
bool clocksourceTrustsTsc(const std::string& name) noexcept;
/// The steady clock's time, cheaply: where now() reads the counter, the last steady reading plus
/// the counter's time since, the steady clock read again (by whichever thread asks) once the
/// counter says a millisecond passed. A small call reads the time several times (its request,
/// its deadline, its duration in the metrics; 24 ns a steady read on the reference VM against
/// 10 for the counter). A reading is off from the steady clock's by the rate's error over at
/// most that millisecond (tens of nanoseconds), and may step back by as much when the steady
/// clock is read again: clamp the difference of two readings at zero. Elsewhere it is
/// std::chrono::steady_clock::now().
std::chrono::steady_clock::time_point steadyNow() noexcept;
/// Measures the counter's rate now (about 1 ms of the calling thread) if not done yet: call it
/// outside timed code; now() and ticksToNs() otherwise do it at their first use.
void calibrate() noexcept;

}  // namespace gs::cycle
