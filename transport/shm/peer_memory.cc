#include "transport/shm/peer_memory.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace gs::transport::shm {

bool readProcessMemory(int32_t pid, uint64_t address, void* dst, size_t bytes, std::string* why) {
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < bytes) {
    iovec local{out + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(address + done)), bytes - done};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR)
        continue;
      if (why != nullptr) {
        *why = n == 0 ? formatString("no bytes at offset %zu of %zu", done, bytes)
                      : formatString("process_vm_readv from pid %d: %s", pid, strerror(errno));
      }
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace gs::transport::shm
