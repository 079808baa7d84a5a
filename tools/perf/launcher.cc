#include "perf/launcher.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "tools/support/loopback_port.h"

extern char** environ;

namespace {

std::string randomHex() {
  unsigned char b[16];
  if (getrandom(b, sizeof(b), 0) != static_cast<ssize_t>(sizeof(b)))
    return "gs-perf";
  std::string s;
  char h[3];
  for (unsigned char c : b) {
    snprintf(h, sizeof(h), "%02x", c);
    s += h;
  }
  return s;
}

// This process's environment with `set` replacing (or adding) those variables.
std::vector<std::string> environmentWith(
    const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& [k, v] : set)
      replaced = replaced || k == key;
    if (!replaced)
      env.push_back(kv);
  }
  for (const auto& [k, v] : set)
    env.push_back(k + "=" + v);
  return env;
}

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

}  // namespace

int launchLocalRanks(int nranks, char** argv, int timeoutSeconds) {
  const int port = gs::support::freeLoopbackPort();
  if (port < 0) {
    fprintf(stderr, "gradstream-perf: cannot find a free loopback port\n");
    return 1;
  }
  const std::string secret = randomHex();
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    // Built before fork: the child only execs. This process may have threads by now (the CUDA
    // driver's, after --device cuda's check), and after fork only async-signal-safe calls are
    // safe in the child (fork(2), signal-safety(7)).
    const std::vector<std::string> env = environmentWith({{"RANK", std::to_string(r)},
                                                          {"WORLD_SIZE", std::to_string(nranks)},
                                                          {"LOCAL_RANK", std::to_string(r)},
                                                          {"MASTER_ADDR", "127.0.0.1"},
                                                          {"MASTER_PORT", std::to_string(port)},
                                                          {"GS_SECRET", secret}});
    std::vector<char*> envp;
    for (const std::string& kv : env)
      envp.push_back(const_cast<char*>(kv.c_str()));
    envp.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      break;
    }
    if (pid == 0) {
      execve("/proc/self/exe", argv, envp.data());
      static const char kMsg[] = "gradstream-perf: execve of /proc/self/exe failed\n";
      (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
      _exit(127);
    }
    pids.push_back(pid);
  }
  int result = pids.size() == static_cast<size_t>(nranks) ? 0 : 1;
  const double deadline = now() + timeoutSeconds;
  size_t alive = pids.size();
  bool killed = false;
  while (alive > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --alive;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0 && result == 0) {
        result = code;
        fprintf(stderr, "gradstream-perf: a rank exited with status %d\n", code);
      }
      continue;
    }
    if ((result != 0 || now() > deadline) && !killed) {
      // One rank failed (the others will fail within their own timeout, but do not wait) or
      // the whole run is over time.
      if (result == 0) {
        fprintf(stderr, "gradstream-perf: ranks still running after %d s, killing them\n",
                timeoutSeconds);
        result = 124;
      }
      usleep(200 * 1000);  // let the peers print their errors first
      for (pid_t p : pids)
        kill(p, SIGKILL);
      killed = true;
    }
    usleep(5 * 1000);
  }
  return result;
}
