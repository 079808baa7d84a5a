#include "tools/support/loopback_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

namespace gs::support {
namespace {

// Binds a loopback TCP socket to `port` (0: any); returns the fd or -1, and the port bound.
int bindLoopback(int port, int* bound) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  *bound = ntohs(a.sin_port);
  return fd;
}

}  // namespace

int freeLoopbackPort() {
  int port = -1;
  const int fd = bindLoopback(0, &port);
  if (fd < 0)
    return -1;
  close(fd);
  return port;
}

int freeLoopbackPortRun(int n) {
  // Start from a process-dependent place in [20000, 32000) so that concurrent test processes
  // do not probe the same ports first.
  std::mt19937 rng(static_cast<uint32_t>(getpid()) * 2654435761u);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int base = 20000 + static_cast<int>(rng() % static_cast<uint32_t>(12000 - n));
    std::vector<int> fds;
    for (int i = 0; i < n; ++i) {
      int bound = -1;
      const int fd = bindLoopback(base + i, &bound);
      if (fd < 0)
        break;
      fds.push_back(fd);
    }
    const bool all = static_cast<int>(fds.size()) == n;
    for (int fd : fds)
      close(fd);
    if (all)
      return base;
  }
  return -1;
}

}  // namespace gs::support
