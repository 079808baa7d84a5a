#pragma once

// Picking a rendezvous port for ranks started on this host (gradstream-perf's launcher, the
// multi-process tests).

namespace gs::support {

/// An unused loopback TCP port, found by binding port 0 and asking which port the kernel chose;
/// -1 if no socket could be bound. The port is free again when this returns, so another process
/// could take it before rank 0 binds: the rendezvous then fails with a clear error, and a
/// launcher or test may simply try again.
int freeLoopbackPort();

}  // namespace gs::support
