#pragma once

// Picking a rendezvous port for ranks started on this host (gradstream-perf's launcher, the
// multi-process tests).

namespace gs::support {

/// An unused loopback TCP port, found by binding port 0 and asking which port the kernel chose;
/// -1 if no socket could be bound. The port is free again when this returns, so another process
/// could take it before rank 0 binds: the rendezvous then fails with a clear error, and a
/// launcher or test may simply try again.
int freeLoopbackPort();

/// The first of `n` consecutive loopback ports that are all free now, for code that binds
/// base + local rank (GS_METRICS_ADDRESS). Picked below the kernel's ephemeral range (32768 and
/// up by default), so outgoing connections of other processes, which take ephemeral ports at
/// any moment, cannot land on them between this check and the bind: a port found by binding
/// port 0 is ephemeral, and its neighbour was taken that way in a CI run. -1 if none found.
int freeLoopbackPortRun(int n);

}  // namespace gs::support
