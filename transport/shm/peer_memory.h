#pragma once

// Cross-memory attach (process_vm_readv): the single-copy path between ranks of one host.
// Whether it works is the kernel's ptrace rule (same user, Yama's ptrace_scope, a container's
// seccomp profile), so every device probes each peer before relying on it.

#include <cstddef>
#include <cstdint>
#include <string>

namespace gs::transport::shm {

/// Copies `bytes` at `address` in process `pid` into dst (looping over partial reads). False
/// with *why (when not null) naming the reason: the kernel refused, the range is not mapped
/// there, the process exited.
bool readProcessMemory(int32_t pid, uint64_t address, void* dst, size_t bytes, std::string* why);

}  // namespace gs::transport::shm
