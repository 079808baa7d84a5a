#pragma once

// Where ranks outnumber cores, each rank's waiting thread is kept on a CPU of its own choosing
// (local rank r: the (r mod n)-th CPU it may use), so the ranks of a host stay evenly spread.
//
// Why: ranks waiting there poll and yield (sched_yield), so no CPU ever idles, and the
// kernel's balancer, which mostly moves work to idle CPUs and leaves recently run ("cache hot")
// tasks where they are, keeps whatever placement wake-ups made: three or all four of four ranks
// on one of two CPUs for seconds. Measured on 2 cores, 4 ranks, 64 B sendrecv over shm: 10-17
// us per call in such a placement against 5 us with two ranks per CPU (docs/PERFORMANCE.md
// §10). Nothing stays pinned: the thread is moved, then given back its whole mask, and moved
// again only if it left (stream::Engine::setHomeCpuSlot).

#include <sched.h>

#include <cstdint>
#include <span>
#include <vector>

namespace gs {

/// The CPUs the calling thread may run on, as bytes (CPU c is bit c % 8 of byte c / 8), trailing
/// zero bytes dropped; empty when the mask cannot be read. What a rank tells the others so that
/// every rank knows how many cores each host's ranks share (cpusInUnion), for the cost model.
std::vector<uint8_t> callingThreadCpuMask();

/// How many CPUs are set in at least one of `masks` (as callingThreadCpuMask() writes them): the
/// cores a host's ranks share, whether each may use them all or each was pinned to its own.
int cpusInUnion(std::span<const std::vector<uint8_t>> masks);

/// The CPU the slot-th (0-based, taken modulo their number) of the CPUs in `allowed` is, or -1
/// when `allowed` is empty.
int nthAllowedCpu(const cpu_set_t& allowed, int slot);

/// Moves the calling thread onto the slot-th CPU of its affinity mask, then gives it back its
/// whole mask: the thread stays there until the kernel moves it, nothing stays pinned. Returns
/// the CPU; -1 (nothing done) when the mask allows a single CPU (the launcher placed the rank
/// itself, e.g. `taskset` or `mpirun --bind-to core`) or the move fails; -2 when the mask could
/// not be widened again (the allowed CPUs changed meanwhile): the thread stays on that CPU.
int placeCallingThread(int slot);

/// The slot-th CPU of the calling thread's affinity mask, or -1 when the mask allows one CPU
/// (nothing to choose) or cannot be read.
int homeCpuOfCallingThread(int slot);

}  // namespace gs
