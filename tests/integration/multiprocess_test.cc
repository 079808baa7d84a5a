// Multi-process integration tests: real processes, only the public C API and the
// gradstream-perf tool. Every wait is bounded; a child still running when its deadline passes
// (or when a test ends early) is killed with its whole process group.
//
// The ranks of these tests share one host, where shared memory (GS_SHM, on by default) would
// carry their links: each test says which transport it means. Tests of the network transport
// set GS_SHM=0 and check that the ranks report tcp; the *Shm tests set GS_SHM=1 and check that
// they report shm (gs_comm_stats_t.transport, printed by gradstream-perf and gs-integ-rank), so
// they fail, not pass silently over tcp, where the shm transport cannot open.
//
//  - Tcp/Perf.*, Shm/Perf.*: gradstream-perf --ranks 2|4 -c 1 across collectives, dtypes, ops,
//                 in place, over tcp and over shm.
//  - Loop:        4 gs-integ-rank processes joined from the environment run verified allreduces
//                 (tcp, and shm).
//  - DeadPeer:    SIGKILL one of 4 ranks mid-allreduce; the others fail with GS_ERR_REMOTE
//                 naming it, within the timeout (tcp, and shm).
//  - StoppedPeer: SIGSTOP one of 4 ranks past the timeout; every survivor names it
//  (GS_ERR_TIMEOUT),
//                 and the resumed rank is told it was reported at fault.
//  - MismatchedCall: one rank calls with another count; every rank reports both counts and ranks.
//  - WrongSecret: a rank with another GS_SECRET is refused; rank 0 times out clearly.
//  - Netns/*:     two ranks in two network namespaces joined by a veth pair (needs root and
//                 iproute2, skips otherwise), each namespace a host of its own (GS_HOSTNAME);
//                 traffic stays in 198.18.0.0/24.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tools/support/loopback_port.h"

#ifndef GS_PERF_EXE
#error "GS_PERF_EXE must name the gradstream-perf binary"
#endif
#ifndef GS_RANK_EXE
#error "GS_RANK_EXE must name the gs-integ-rank binary"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch directory for the children's output, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/gsit-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr)
      path_ = buf.data();
  }
  ~TempDir() {
    if (path_.empty())
      return;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name != "." && name != "..")
          unlink((path_ + "/" + name).c_str());
      }
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One child process in its own process group, stdout and stderr in files.
class Child {
 public:
  Child(std::string name,
        const std::vector<std::string>& argv,
        const Env& env,
        const std::string& dir)
      : name_(std::move(name)), out_(dir + "/" + name_ + ".out"), err_(dir + "/" + name_ + ".err") {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      // Nothing from the test runner's own launch environment may leak into the ranks.
      static const char* const kClear[] = {"RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "GS_TRANSPORT",
                                           "GS_TIMEOUT_MS",
                                           "GS_CHUNK_BYTES",
                                           "GS_SLOTS_PER_PEER",
                                           "GS_TCP_SOCKETS",
                                           "GS_CODEC",
                                           "GS_METRICS_ADDR",
                                           "GS_SOCKET_IFNAME",
                                           "GS_SECRET",
                                           "GS_SHM",
                                           "GS_HOSTNAME"};
      for (const char* v : kClear)
        unsetenv(v);
      for (const auto& [k, v] : env)
        setenv(k.c_str(), v.c_str(), 1);
      int o = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      int e = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (o < 0 || e < 0)
        _exit(126);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char*> args;
      for (const auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      perror("execvp");
      _exit(127);
    }
    if (pid_ > 0)
      setpgid(pid_, pid_);  // also here: no race with the child's own call
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(-pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
    }
  }

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // Waits until the child exits or the deadline passes; true when it exited.
  bool waitUntil(Clock::time_point deadline) {
    while (!exited_) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        exitTime_ = Clock::now();
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (Clock::now() >= deadline)
        return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  void killGroup(int sig) {
    if (pid_ > 0 && !exited_)
      kill(-pid_, sig);
  }

  bool exited() const { return exited_; }
  int code() const { return code_; }
  Clock::time_point exitTime() const { return exitTime_; }
  std::string out() const { return readFile(out_); }
  std::string err() const { return readFile(err_); }
  std::string describe() const {
    std::string s = "--- " + name_ + " (exit " + (exited_ ? std::to_string(code_) : "none") +
                    ") stdout:\n" + tail(out()) + "--- " + name_ + " stderr:\n" + tail(err());
    return s;
  }

  // The "RESULT ..." line gs-integ-rank prints last, split into its fields.
  std::map<std::string, std::string> result() const {
    std::map<std::string, std::string> fields;
    std::istringstream in(out());
    std::string line, last;
    while (std::getline(in, line)) {
      if (line.rfind("RESULT ", 0) == 0)
        last = line;
    }
    static const std::regex re("^RESULT rank=(-?[0-9]+) status=(\\S+) message=(.*)$");
    std::smatch m;
    if (std::regex_match(last, m, re)) {
      fields["rank"] = m[1];
      fields["status"] = m[2];
      fields["message"] = m[3];
    }
    return fields;
  }

 private:
  static std::string tail(const std::string& s, size_t n = 4000) {
    return s.size() <= n ? s : "[...]" + s.substr(s.size() - n);
  }

  std::string name_, out_, err_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
  Clock::time_point exitTime_{};
};

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

double secondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The transport gradstream-perf reports for rank 0's links ("# transport: shm"); "" if none.
std::string perfTransport(const std::string& out) {
  static const std::regex re("(^|\n)# transport: (\\S+)");
  std::smatch m;
  return std::regex_search(out, m, re) ? m[2].str() : "";
}

// The transport gs-integ-rank reports in its READY line; "" before it printed one.
std::string rankTransport(const std::string& out) {
  static const std::regex re("(^|\n)READY rank=[0-9]+ nranks=[0-9]+ transport=(\\S+)");
  std::smatch m;
  return std::regex_search(out, m, re) ? m[2].str() : "";
}

// Checks gradstream-perf's table on rank 0's stdout: at least one data row, every #wrong 0,
// and the final "Out of bounds values : 0 OK" line.
void expectPerfTableClean(const std::string& out, const std::string& context) {
  std::istringstream in(out);
  std::string line;
  int rows = 0;
  bool summary = false;
  while (std::getline(in, line)) {
    if (line.find("# Out of bounds values : 0 OK") != std::string::npos)
      summary = true;
    if (line.empty() || line[0] == '#')
      continue;
    std::istringstream fields(line);
    std::vector<std::string> f;
    std::string w;
    while (fields >> w)
      f.push_back(w);
    if (f.size() != 10)
      continue;
    ++rows;
    EXPECT_EQ(f[8], "0") << "#wrong is not 0 in row '" << line << "'\n" << context;
    EXPECT_FALSE(f[9].empty()) << "no algorithm in row '" << line << "'\n" << context;
  }
  EXPECT_GE(rows, 1) << "no result rows\n" << context;
  EXPECT_TRUE(summary) << "no '# Out of bounds values : 0 OK' line\n" << context;
}

// ------------------------------------------------------------------------------------------
// a. gradstream-perf --ranks N over real TCP (GS_SHM=0) and over shared memory (GS_SHM=1)

struct PerfCase {
  const char* name;
  int ranks;
  std::vector<std::string> args;
  const char* transport;  // "tcp" or "shm": GS_SHM=0 or 1, and what rank 0 must report
  Env env;                // more settings of the ranks
};

std::vector<PerfCase> perfCases(const char* transport) {
  struct Shape {
    const char* name;
    std::vector<std::string> args;
    Env env;
  };
  const std::vector<Shape> shapes = {
      {"AllreduceFloat32Sum", {"--coll", "allreduce", "-d", "float32", "-o", "sum"}},
      {"AllreduceBfloat16Max", {"--coll", "allreduce", "-d", "bfloat16", "-o", "max"}},
      {"AllreduceInt32AvgInPlace",
       {"--coll", "allreduce", "-d", "int32", "-o", "avg", "--inplace"}},
      {"AllreduceFloat16ProdInPlace",
       {"--coll", "allreduce", "-d", "float16", "-o", "prod", "--inplace"}},
      {"ReduceScatterFloat32Sum", {"--coll", "reduce_scatter", "-d", "float32", "-o", "sum"}},
      {"ReduceScatterBfloat16MinInPlace",
       {"--coll", "reduce_scatter", "-d", "bfloat16", "-o", "min", "--inplace"}},
      {"ReduceScatterInt64Avg", {"--coll", "reduce_scatter", "-d", "int64", "-o", "avg"}},
      {"AllgatherFloat32", {"--coll", "allgather", "-d", "float32"}},
      {"AllgatherUint8InPlace", {"--coll", "allgather", "-d", "uint8", "--inplace"}},
      {"BroadcastFloat64Root1", {"--coll", "broadcast", "-d", "float64", "-r", "1"}},
      {"BroadcastInt32InPlace", {"--coll", "broadcast", "-d", "int32", "--inplace"}},
      {"SendOneWayFloat16", {"--coll", "send", "-d", "float16"}},
      // Many chunks per step (more than a group of slots) on links that carry several steps:
      // both ends must queue them alike (a 16 MiB tree allreduce once failed on this).
      {"AllreduceTreeManyChunks",
       {"--coll", "allreduce", "-d", "float32", "-o", "sum"},
       {{"GS_ALGO", "tree"}, {"GS_CHUNK_BYTES", "65536"}}},
      {"AllreduceHalvingDoublingManyChunksInPlace",
       {"--coll", "allreduce", "-d", "float32", "-o", "sum", "--inplace"},
       {{"GS_ALGO", "halving_doubling"}, {"GS_CHUNK_BYTES", "65536"}}},
      // Whole buffers both ways in place: each round's reduction into the buffer must wait for
      // the send reading it (1 KiB to 4 MiB: one chunk to many per round).
      {"AllreduceRecursiveDoublingAvgInPlace",
       {"--coll", "allreduce", "-d", "float32", "-o", "avg", "--inplace"},
       {{"GS_ALGO", "recursive_doubling"}, {"GS_CHUNK_BYTES", "65536"}}},
  };
  std::vector<PerfCase> cases;
  for (int ranks : {2, 4}) {
    for (const Shape& shape : shapes)
      cases.push_back({shape.name, ranks, shape.args, transport, shape.env});
  }
  // Not a power of two: the pairwise fold in and out of the logarithmic schedules.
  for (const Shape& shape : shapes) {
    if (!shape.env.empty() && shape.env.front().second != "tree")
      cases.push_back({shape.name, 3, shape.args, transport, shape.env});
  }
  return cases;
}

// Readable parameters in test output instead of a byte dump.
void PrintTo(const PerfCase& c, std::ostream* os) {
  *os << c.ranks << " ranks over " << c.transport << ":";
  for (const auto& a : c.args)
    *os << ' ' << a;
}

class Perf : public ::testing::TestWithParam<PerfCase> {};

TEST_P(Perf, NoWrongElements) {
  const PerfCase& c = GetParam();
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::vector<std::string> argv = {GS_PERF_EXE, "--ranks", std::to_string(c.ranks),
                                   "-b",        "1K",      "-e",
                                   "4M",        "-f",      "16",
                                   "-n",        "3",       "-w",
                                   "1",         "-c",      "1",
                                   "--timeout", "25"};
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  std::string cmd;
  for (const auto& a : argv)
    cmd += a + " ";
  const std::string shm = std::string(c.transport) == "shm" ? "1" : "0";
  Env env = {{"GS_TIMEOUT_MS", "10000"}, {"GS_SHM", shm}};
  env.insert(env.end(), c.env.begin(), c.env.end());
  for (const auto& [name, value] : c.env)
    cmd = name + "=" + value + " " + cmd;
  Child perf("perf", argv, env, dir.path());
  ASSERT_TRUE(perf.started());
  const bool exited = perf.waitUntil(after(28));
  const std::string context = "command: GS_SHM=" + shm + " " + cmd + "\n" + perf.describe();
  ASSERT_TRUE(exited) << "gradstream-perf still running after 28 s\n" << context;
  EXPECT_EQ(perf.code(), 0) << context;
  EXPECT_EQ(perfTransport(perf.out()), c.transport)
      << "rank 0's links are not all over " << c.transport << "\n"
      << context;
  expectPerfTableClean(perf.out(), context);
}

std::string perfCaseName(const ::testing::TestParamInfo<PerfCase>& p) {
  return std::string(p.param.name) + "_" + std::to_string(p.param.ranks) + "Ranks";
}

INSTANTIATE_TEST_SUITE_P(Tcp, Perf, ::testing::ValuesIn(perfCases("tcp")), perfCaseName);
// Needs the shm transport: where it cannot open, the ranks fall back to tcp and these fail.
INSTANTIATE_TEST_SUITE_P(Shm, Perf, ::testing::ValuesIn(perfCases("shm")), perfCaseName);

// The bytes gradstream-perf says the rank that copied most out of its peers' memory copied
// (GS_SHM_SINGLE_COPY); -1 when the line is missing.
long long perfSingleCopyBytes(const std::string& out) {
  static const std::regex re("(^|\n)# single_copy_bytes ([0-9]+)");
  std::smatch m;
  return std::regex_search(out, m, re) ? std::stoll(m[2].str()) : -1;
}

// Whether this process may read a child's memory with process_vm_readv (the kernel's ptrace
// rules: Yama's ptrace_scope or a seccomp profile may forbid it even for the same user).
bool crossMemoryAttachAllowed() {
  static volatile uint64_t word = 0x5eedf00d;
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  if (child < 0)
    return false;
  uint64_t got = 0;
  iovec local{&got, sizeof(got)};
  iovec remote{const_cast<uint64_t*>(&word), sizeof(word)};
  const bool ok =
      process_vm_readv(child, &local, 1, &remote, 1, 0) == sizeof(got) && got == 0x5eedf00d;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return ok;
}

// Runs gradstream-perf over shm with GS_SHM_SINGLE_COPY=setting and the given arguments,
// checks that it passed with exact results, and returns the single_copy_bytes it printed.
long long singleCopiedBytes(const std::vector<std::string>& args, const char* setting) {
  TempDir dir;
  EXPECT_FALSE(dir.path().empty());
  std::vector<std::string> argv = {GS_PERF_EXE, "-n", "3", "-w", "1", "-c", "1", "--timeout", "25"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string context = std::string("GS_SHM_SINGLE_COPY=") + setting;
  for (const auto& a : argv)
    context += " " + a;
  Child perf("perf", argv,
             {{"GS_TIMEOUT_MS", "10000"}, {"GS_SHM", "1"}, {"GS_SHM_SINGLE_COPY", setting}},
             dir.path());
  EXPECT_TRUE(perf.started()) << context;
  if (!perf.started())
    return -1;
  const bool exited = perf.waitUntil(after(28));
  context += "\n" + perf.describe();
  EXPECT_TRUE(exited) << context;
  EXPECT_EQ(perf.code(), 0) << context;
  EXPECT_EQ(perfTransport(perf.out()), "shm") << context;
  expectPerfTableClean(perf.out(), context);
  return perfSingleCopyBytes(perf.out());
}

// Over shm, chunks of 64 KiB and more that the receiver keeps as they are (all-to-all,
// messages, gathers, allreduce's gathering phase) are copied once, by the receiver, out of the
// sender's memory; the ring at 3 ranks also forwards from where it copied them. Results are
// exact either way, and GS_SHM_SINGLE_COPY=0 copies through the shared segment only. Where the
// kernel forbids reading another process, the ranks must fall back to the copy: then nothing is
// single-copied with either setting, and the results are still exact.
TEST(SingleCopy, LargeChunksBetweenProcessesAreCopiedOnceAndExactly) {
  const bool allowed = crossMemoryAttachAllowed();
  if (!allowed)
    std::cerr << "process_vm_readv is not permitted here: checking the fallback only\n";
  struct Case {
    const char* coll;
    int ranks;
  };
  for (const Case& c : {Case{"alltoall", 2}, Case{"sendrecv", 2}, Case{"allgather", 3},
                        Case{"allreduce", 2}, Case{"broadcast", 2}, Case{"send", 2}}) {
    for (const char* setting : {"1", "0"}) {
      const long long copied = singleCopiedBytes({"--ranks", std::to_string(c.ranks), "--coll",
                                                  c.coll, "-b", "4K", "-e", "4M", "-f", "32"},
                                                 setting);
      if (std::string(setting) == "1" && allowed)
        EXPECT_GT(copied, 0) << c.coll << " at " << c.ranks << " ranks";
      else
        EXPECT_EQ(copied, 0) << c.coll << " at " << c.ranks
                             << " ranks, GS_SHM_SINGLE_COPY=" << setting;
    }
  }
}

// A rank that receives nothing in a call (a one-way send, a broadcast's root) copies its
// chunks of a transfer from 256 KiB into the shared slots itself, beside the receiver's copy
// out of the previous chunk: the receiver's page-by-page read of the sender's memory alone was
// the slower (engine_run.h, leftForPeer). A smaller one-way transfer, and one where both ends
// receive, are still copied once.
TEST(SingleCopy, OneWayTransfersFromAQuarterMebibyteAreCopiedByBothEnds) {
  if (!crossMemoryAttachAllowed())
    GTEST_SKIP() << "process_vm_readv is not permitted here: nothing is single-copied";
  for (const char* coll : {"send", "broadcast"}) {
    EXPECT_EQ(singleCopiedBytes(
                  {"--ranks", "2", "--coll", coll, "-b", "256K", "-e", "4M", "-f", "4"}, "1"),
              0)
        << coll << ": one way, 256 KiB-4 MiB";
    EXPECT_GT(singleCopiedBytes({"--ranks", "2", "--coll", coll, "-b", "128K", "-e", "128K"}, "1"),
              0)
        << coll << ": one way, 128 KiB";
  }
  EXPECT_GT(singleCopiedBytes({"--ranks", "2", "--coll", "sendrecv", "-b", "4M", "-e", "4M"}, "1"),
            0)
      << "sendrecv: both ways, 4 MiB";
}

// ------------------------------------------------------------------------------------------
// Ranks of gs-integ-rank launched by the test itself.

class Ranks {
 public:
  Ranks(const std::string& dir,
        int nranks,
        int port,
        const std::string& count,
        const std::string& iters,
        const std::string& timeoutMs,
        const std::map<int, std::string>& secretOverride = {},
        const Env& extra = {},
        const std::map<int, std::string>& countOverride = {}) {
    for (int r = 0; r < nranks; ++r) {
      auto it = secretOverride.find(r);
      auto counted = countOverride.find(r);
      // The network transport unless `extra` says GS_SHM=1 (set later, so it wins).
      Env env = {{"RANK", std::to_string(r)},
                 {"WORLD_SIZE", std::to_string(nranks)},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", std::to_string(port)},
                 {"GS_SECRET", it != secretOverride.end() ? it->second : "gsit-secret"},
                 {"GS_TIMEOUT_MS", timeoutMs},
                 {"GS_DEBUG", "warn"},
                 {"GS_SHM", "0"}};
      env.insert(env.end(), extra.begin(), extra.end());
      children_.push_back(std::make_unique<Child>(
          "rank" + std::to_string(r),
          std::vector<std::string>{GS_RANK_EXE, "loop",
                                   counted != countOverride.end() ? counted->second : count, iters},
          env, dir));
    }
  }
  Child& operator[](int r) { return *children_[r]; }
  int size() const { return static_cast<int>(children_.size()); }
  std::string describe() const {
    std::string s;
    for (const auto& c : children_)
      s += c->describe();
    return s;
  }

 private:
  std::vector<std::unique_ptr<Child>> children_;
};

// Waits until every rank has finished at least one allreduce of its loop (so all links are up
// and traffic flows); fails the test when one exits first or 30 s pass (a hang guard: 4 ranks
// in the emulated RDMA guest took 11 s to get there with the host's cores busy elsewhere).
void waitUntilEveryRankLooped(Ranks& ranks) {
  const auto startDeadline = after(30);
  for (int r = 0; r < ranks.size(); ++r) {
    const std::string marker = "rank=" + std::to_string(r) + " iter=";
    while (ranks[r].out().find(marker) == std::string::npos) {
      ASSERT_LT(Clock::now(), startDeadline) << "rank " << r << " never completed an allreduce\n"
                                             << ranks.describe();
      ASSERT_FALSE(ranks[r].waitUntil(Clock::now())) << "rank " << r << " exited early\n"
                                                     << ranks.describe();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

// transport: what every rank must report.
void verifiedLoop(const Env& extra, const std::string& transport) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const int port = gs::support::freeLoopbackPort();
  ASSERT_GT(port, 0);
  // odd count: uneven chunks
  Ranks ranks(dir.path(), 4, port, "262147", "20", "10000", {}, extra);
  // A bound against hangs, not a speed check: 0.4 s on the host, 14 s in the emulated RDMA guest
  // (rdma.multiprocess), 21 s there with the host's two cores busy with other work; under the
  // host tests' 60 s ctest limit, so that a hang still ends with the ranks' output.
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(ranks[r].waitUntil(after(45))) << "rank " << r << " still running\n"
                                               << ranks.describe();
  }
  for (int r = 0; r < 4; ++r) {
    auto res = ranks[r].result();
    EXPECT_EQ(rankTransport(ranks[r].out()), transport) << "rank " << r << "\n" << ranks.describe();
    EXPECT_EQ(ranks[r].code(), 0) << ranks.describe();
    EXPECT_EQ(res["status"], "GS_OK") << ranks.describe();
    EXPECT_EQ(res["rank"], std::to_string(r)) << ranks.describe();
    EXPECT_NE(ranks[r].out().find("rank=" + std::to_string(r) + " iter=19 ok"), std::string::npos)
        << ranks.describe();
  }
}

// The network transport: tcp here; rdma.multiprocess runs it in the Soft-RoCE VM (GS_VM set),
// where GS_TRANSPORT=auto resolves to verbs.
std::string networkTransport() {
  return getenv("GS_VM") != nullptr ? "verbs" : "tcp";
}

TEST(Loop, FourRanksVerifiedAllreduces) {
  verifiedLoop({}, networkTransport());
}

// Needs the shm transport.
TEST(Loop, FourRanksVerifiedAllreducesOverShm) {
  verifiedLoop({{"GS_SHM", "1"}}, "shm");
}

// Ranks held to fewer CPUs than there are of them (a launcher's taskset or cpuset, which the
// machine's CPU count does not show): every rank counts the CPUs its host's ranks may use from
// their records, so 2 ranks on one CPU yield while they wait (they spun, each holding the CPU
// the other needed: 2-rank 8 B allreduce over shm on one CPU 8.0 -> 2.0 us) and the cost model
// prices them as crowded. The affinity is set on the launching thread; the ranks inherit it.
TEST(Crowding, RanksHeldToOneCpuCountItAndYield) {
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &before))
    ++first;
  ASSERT_LT(first, CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const int port = gs::support::freeLoopbackPort();
  ASSERT_GT(port, 0);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  std::unique_ptr<Ranks> ranks;
  {
    struct Restore {
      cpu_set_t mask;
      ~Restore() { sched_setaffinity(0, sizeof(mask), &mask); }
    } restore{before};
    ranks = std::make_unique<Ranks>(dir.path(), 2, port, "1027", "20", "10000",
                                    std::map<int, std::string>{},
                                    Env{{"GS_SHM", "1"}, {"GS_DEBUG", "info"}});
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE((*ranks)[r].waitUntil(after(25))) << "rank " << r << " still running\n"
                                                  << ranks->describe();
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((*ranks)[r].code(), 0) << ranks->describe();
    EXPECT_EQ((*ranks)[r].result()["status"], "GS_OK") << ranks->describe();
    const std::string log = (*ranks)[r].err();
    EXPECT_NE(log.find("(2 ranks on 1 cores there"), std::string::npos) << "rank " << r << "\n"
                                                                        << ranks->describe();
    EXPECT_NE(log.find("2 ranks share 1 cores on this host: yielding"), std::string::npos)
        << "rank " << r << "\n"
        << ranks->describe();
  }
}

// ------------------------------------------------------------------------------------------
// b. A dead peer: SIGKILL rank 2 of 4 mid-allreduce.
//
// With one tcp socket per peer this passes reliably. With the default two sockets per peer it
// fails in roughly a third of runs (library bug, reported): the far rank 0 sometimes reports
// "connection to rank 1 (...) closed by peer" (or rank 3) instead of "rank 2 failed (reported
// by rank 1)": the neighbour's abort notice travels on one socket of the pair and its exit
// closes the other, and rank 0 acts on whichever it reads first. That variant stays disabled
// until the bug is fixed; run it with --gtest_also_run_disabled_tests.

// transport: what every rank must report before the kill.
void deadPeer(const Env& extra, const std::string& transport) {
  // The communicator's timeout also bounds init, which takes seconds for 4 ranks in the
  // emulated RDMA guest (rdma.multiprocess; a clean-clone CI on a loaded host once failed there
  // with every rank's "did not send its slot key in time" at 5 s). The kill itself must be
  // noticed well inside the timeout, through the connections, never by it: kNoticeMs.
  constexpr int kRanks = 4, kVictim = 2, kTimeoutMs = 20000, kNoticeMs = 8000;
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const int port = gs::support::freeLoopbackPort();
  ASSERT_GT(port, 0);
  // 4 MiB float32 allreduces until something fails.
  Ranks ranks(dir.path(), kRanks, port, std::to_string(1 << 20), "0", std::to_string(kTimeoutMs),
              {}, extra);

  // Wait until every rank has finished at least one allreduce (so all links are up and traffic
  // flows), then let them run for about a second.
  ASSERT_NO_FATAL_FAILURE(waitUntilEveryRankLooped(ranks));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(rankTransport(ranks[r].out()), transport) << "rank " << r << "\n" << ranks.describe();
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_FALSE(ranks[r].waitUntil(Clock::now())) << "rank " << r << " exited before the kill\n"
                                                   << ranks.describe();
  }

  const auto killed = Clock::now();
  ranks[kVictim].killGroup(SIGKILL);
  ASSERT_TRUE(ranks[kVictim].waitUntil(after(5)));

  // Every survivor must notice within kNoticeMs, process exit included.
  const auto deadline = killed + std::chrono::milliseconds(kNoticeMs);
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim)
      continue;
    EXPECT_TRUE(ranks[r].waitUntil(deadline)) << "rank " << r << " still running " << kNoticeMs
                                              << " ms after rank " << kVictim << " was killed\n"
                                              << ranks.describe();
  }
  const std::regex namesVictim("\\brank " + std::to_string(kVictim) + "\\b");
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim || !ranks[r].exited())
      continue;
    auto res = ranks[r].result();
    const double seconds = secondsBetween(killed, ranks[r].exitTime());
    // Neighbours (1 and 3) see the broken connection, the far rank (0) the abort they
    // forward; all of them must report GS_ERR_REMOTE, never a timeout.
    EXPECT_EQ(res["status"], "GS_ERR_REMOTE") << "rank " << r << " after " << seconds << " s\n"
                                              << ranks.describe();
    EXPECT_EQ(ranks[r].code(), 5) << ranks.describe();
    EXPECT_TRUE(std::regex_search(res["message"], namesVictim))
        << "rank " << r << "'s message does not name rank " << kVictim << ": " << res["message"];
    EXPECT_LE(seconds, kNoticeMs / 1000.0);
    printf("rank %d: %s after %.3f s: %s\n", r, res["status"].c_str(), seconds,
           res["message"].c_str());
  }
}

TEST(DeadPeer, OneSocketPerPeerKilledRankGivesRemoteErrorNamingIt) {
  deadPeer({{"GS_TCP_SOCKETS", "1"}}, networkTransport());
}

// The default configuration (2 sockets per peer). Flaky because of the bug described above.
TEST(DeadPeer, KilledRankGivesRemoteErrorNamingItOnEveryOtherRank) {
  deadPeer({}, "tcp");
}

// Over shared memory: the neighbours learn of the death from the shm transport itself (the
// peer's pid), the far rank from their abort notice. Needs the shm transport.
TEST(DeadPeer, ShmKilledRankGivesRemoteErrorNamingItOnEveryOtherRank) {
  deadPeer({{"GS_SHM", "1"}}, "shm");
}

// ------------------------------------------------------------------------------------------
// d2. A stopped rank (SIGSTOP past the timeout): in a ring the ranks further on wait for ranks
// that only wait themselves. Every survivor must name the stopped rank (the liveness check finds
// it), none another, and the stopped rank, resumed, is told it was reported at fault.
TEST(StoppedPeer, EverySurvivorNamesTheStoppedRankAndItIsToldSo) {
  constexpr int kRanks = 4, kVictim = 2, kTimeoutMs = 2000;
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const int port = gs::support::freeLoopbackPort();
  ASSERT_GT(port, 0);
  Ranks ranks(dir.path(), kRanks, port, std::to_string(1 << 18), "0", std::to_string(kTimeoutMs));
  ASSERT_NO_FATAL_FAILURE(waitUntilEveryRankLooped(ranks));
  const auto stopped = Clock::now();
  ranks[kVictim].killGroup(SIGSTOP);
  // The timeout, the liveness check's grace (a quarter of it) and the notice's way round, plus
  // process exit on a loaded host.
  const auto deadline = stopped + std::chrono::milliseconds(kTimeoutMs * 2 + 3000);
  for (int r = 0; r < kRanks; ++r) {
    if (r != kVictim) {
      EXPECT_TRUE(ranks[r].waitUntil(deadline)) << "rank " << r << " still running\n"
                                                << ranks.describe();
    }
  }
  ranks[kVictim].killGroup(SIGCONT);
  EXPECT_TRUE(ranks[kVictim].waitUntil(after(kTimeoutMs / 1000.0 + 5))) << ranks.describe();
  const std::string atFault = "rank " + std::to_string(kVictim) + " stopped making progress";
  for (int r = 0; r < kRanks; ++r) {
    if (!ranks[r].exited())
      continue;
    auto res = ranks[r].result();
    printf("rank %d: %s after %.3f s: %s\n", r, res["status"].c_str(),
           secondsBetween(stopped, ranks[r].exitTime()), res["message"].c_str());
    EXPECT_EQ(res["status"], "GS_ERR_TIMEOUT") << "rank " << r << "\n" << ranks.describe();
    EXPECT_NE(res["message"].find(atFault), std::string::npos)
        << "rank " << r << " does not name rank " << kVictim << " at fault: " << res["message"];
    if (r == kVictim) {
      EXPECT_NE(res["message"].find("reported this rank at fault"), std::string::npos)
          << res["message"];
    }
  }
}

// d3. Ranks that call with different counts: every rank reports the cause with both ranks and
// both counts, not only the rank that noticed.
TEST(MismatchedCall, EveryRankReportsTheCountsAndWhoDetectedThem) {
  constexpr int kRanks = 4, kOdd = 2;
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const int port = gs::support::freeLoopbackPort();
  ASSERT_GT(port, 0);
  Ranks ranks(dir.path(), kRanks, port, "1048576", "1", "5000", {}, {}, {{kOdd, "1052675"}});
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(ranks[r].waitUntil(after(15))) << "rank " << r << " still running\n"
                                               << ranks.describe();
  }
  const std::regex cause(
      "count differs between ranks: rank ([0-9]) called with ([0-9]+), rank ([0-9]) with "
      "([0-9]+)");
  for (int r = 0; r < kRanks; ++r) {
    auto res = ranks[r].result();
    printf("rank %d: %s: %s\n", r, res["status"].c_str(), res["message"].c_str());
    EXPECT_EQ(res["status"], "GS_ERR_INVALID_ARGUMENT") << "rank " << r << "\n" << ranks.describe();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(res["message"], m, cause))
        << "rank " << r << " does not carry the cause: " << res["message"];
    // One of the two ranks named is the odd one, with its count.
    const bool oddFirst = m[1] == std::to_string(kOdd);
    EXPECT_TRUE(oddFirst || m[3] == std::to_string(kOdd)) << res["message"];
    EXPECT_EQ(oddFirst ? m[2].str() : m[4].str(), "1052675") << res["message"];
    EXPECT_EQ(oddFirst ? m[4].str() : m[2].str(), "1048576") << res["message"];
    // The cause reads "rank <sender> called with .., rank <detector> with ..": the detecting
    // rank says nothing more, every other rank (the odd one too: a mismatch has no one rank at
    // fault) says who detected it.
    const std::string detector = m[3].str();
    if (detector != std::to_string(r)) {
      EXPECT_NE(res["message"].find("detected by rank " + detector), std::string::npos)
          << res["message"];
    }
  }
}

// ------------------------------------------------------------------------------------------
// d. Wrong secret across processes.

struct WrongSecretRun {
  std::map<std::string, std::string> impostor, rank0;
  std::string log0, all;
};

// Rank 1 joins with another GS_SECRET; both must be done within the timeout plus a margin.
void runWrongSecret(WrongSecretRun& run) {
  constexpr int kTimeoutMs = 3000;
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const int port = gs::support::freeLoopbackPort();
  ASSERT_GT(port, 0);
  Ranks ranks(dir.path(), 2, port, "1024", "1", std::to_string(kTimeoutMs),
              {{1, "not-the-secret"}});
  const auto deadline = after(kTimeoutMs / 1000.0 + 4.0);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(ranks[r].waitUntil(deadline)) << "rank " << r << " still running\n"
                                              << ranks.describe();
  }
  run.all = ranks.describe();
  run.impostor = ranks[1].result();
  run.rank0 = ranks[0].result();
  run.log0 = ranks[0].err();
  EXPECT_EQ(ranks[1].code(), 1) << run.all;
  EXPECT_EQ(ranks[0].code(), 6) << run.all;
  // Rank 0 reports its rendezvous (naming the endpoint) and that it timed out.
  EXPECT_NE(run.rank0["message"].find("rendezvous with 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << run.all;
  EXPECT_NE(run.rank0["message"].find("timed out"), std::string::npos) << run.all;
  printf("impostor: %s: %s\nrank 0: %s: %s\n", run.impostor["status"].c_str(),
         run.impostor["message"].c_str(), run.rank0["status"].c_str(),
         run.rank0["message"].c_str());
}

TEST(WrongSecret, ImpostorRefusedAndRankZeroTimesOutClearly) {
  WrongSecretRun run;
  ASSERT_NO_FATAL_FAILURE(runWrongSecret(run));
  EXPECT_EQ(run.impostor["status"], "GS_ERR_INVALID_ARGUMENT") << run.all;
  EXPECT_NE(run.impostor["message"].find("wrong communicator secret"), std::string::npos)
      << run.all;
  EXPECT_EQ(run.rank0["status"], "GS_ERR_TIMEOUT") << run.all;
  // Rank 0's log says why nobody arrived: the impostor was rejected (logged when it happens).
  EXPECT_TRUE(std::regex_search(
      run.log0, std::regex("rejected rendezvous connection from 127\\.0\\.0\\.1:[0-9]+: "
                           "wrong communicator secret")))
      << run.all;
}

// Rank 0's error should name the missing rank. It does not reliably (library issue, reported):
// rank 0's client deadline starts before its rendezvous server's timer (which starts at the
// first registration), so the client gives up a few ms first with the generic "timed out ...
// waiting for all ranks to arrive", and the process usually exits before the server's
// "rank(s) 1 never arrived" is even logged. Enable when fixed.
TEST(WrongSecret, RankZeroNamesTheMissingRank) {
  WrongSecretRun run;
  ASSERT_NO_FATAL_FAILURE(runWrongSecret(run));
  EXPECT_NE(run.rank0["message"].find("rank(s) 1 never arrived"), std::string::npos) << run.all;
}

// ------------------------------------------------------------------------------------------
// c. Ranks on different hosts: two network namespaces joined by a veth pair.

bool sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

std::string shOut(const std::string& command) {
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p))
      out += buf;
    pclose(p);
  }
  return out;
}

class Netns : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "needs root to create network namespaces";
    if (!sh("ip netns list"))
      GTEST_SKIP() << "'ip netns' does not work here (iproute2 missing?)";
    removeStale();
    const std::string id = std::to_string(getpid());
    a_ = "gsit-" + id + "-a";
    b_ = "gsit-" + id + "-b";
    vethA_ = "gsit" + id + "a";
    vethB_ = "gsit" + id + "b";
    if (!sh("ip netns add " + a_))
      GTEST_SKIP() << "'ip netns add' failed (no privilege?)";
    created_ = true;
    if (!sh("ip netns add " + b_))
      GTEST_SKIP() << "'ip netns add' failed for the second namespace";
    const std::string steps[] = {
        "ip link add " + vethA_ + " netns " + a_ + " type veth peer name " + vethB_ + " netns " +
            b_,
        "ip -n " + a_ + " addr add 198.18.0.1/24 dev " + vethA_,
        "ip -n " + b_ + " addr add 198.18.0.2/24 dev " + vethB_,
        "ip -n " + a_ + " link set " + vethA_ + " up",
        "ip -n " + b_ + " link set " + vethB_ + " up",
        "ip -n " + a_ + " link set lo up",
        "ip -n " + b_ + " link set lo up",
    };
    for (const auto& step : steps) {
      if (!sh(step))
        GTEST_SKIP() << "cannot set up the namespaces: '" << step << "' failed";
    }
  }
  void TearDown() override {
    if (!created_)
      return;
    sh("ip netns del " + a_);
    sh("ip netns del " + b_);
  }

  // Namespaces left by an earlier run of this test that was killed (its pid is gone).
  static void removeStale() {
    std::istringstream in(shOut("ip netns list 2>/dev/null"));
    std::string line;
    static const std::regex re("^(gsit-([0-9]+)-[ab])\\b.*");
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_match(line, m, re) && kill(std::stoi(m[2]), 0) != 0 && errno == ESRCH) {
        sh("ip netns del " + m[1].str());
      }
    }
  }

  uint64_t txBytes(const std::string& ns, const std::string& dev) {
    return strtoull(shOut("ip netns exec " + ns + " cat /sys/class/net/" + dev +
                          "/statistics/tx_bytes 2>/dev/null")
                        .c_str(),
                    nullptr, 10);
  }

  // Runs gradstream-perf in join mode, rank 0 in namespace a, rank 1 in namespace b.
  void runPerfAcrossNamespaces(bool withIfname) {
    TempDir dir;
    ASSERT_FALSE(dir.path().empty());
    const uint64_t txBefore = txBytes(b_, vethB_);
    std::vector<std::unique_ptr<Child>> ranks;
    for (int r = 0; r < 2; ++r) {
      const std::string ns = r == 0 ? a_ : b_;
      Env env = {
          {"RANK", std::to_string(r)},
          {"WORLD_SIZE", "2"},
          {"MASTER_ADDR", "198.18.0.1"},
          {"MASTER_PORT", "29517"},  // a fresh namespace: every port is free
          {"GS_SECRET", "gsit-netns"},
          {"GS_TIMEOUT_MS", "10000"},
          // Each namespace is a host of its own: the link is the veth pair, not shared memory.
          {"GS_HOSTNAME", r == 0 ? "gsit-host-a" : "gsit-host-b"}};
      if (withIfname)
        env.push_back({"GS_SOCKET_IFNAME", r == 0 ? vethA_ : vethB_});
      ranks.push_back(std::make_unique<Child>(
          "rank" + std::to_string(r),
          std::vector<std::string>{"ip", "netns", "exec", ns, GS_PERF_EXE, "--coll", "allreduce",
                                   "-b", "1K", "-e", "4M", "-f", "16", "-n", "3", "-w", "1", "-c",
                                   "1"},
          env, dir.path()));
    }
    const auto deadline = after(25);
    std::string all;
    for (auto& c : ranks) {
      bool exited = c->waitUntil(deadline);
      all += c->describe();
      if (!exited)
        c->killGroup(SIGKILL);
    }
    for (auto& c : ranks) {
      ASSERT_TRUE(c->exited()) << c->name() << " still running after 25 s\n" << all;
      EXPECT_EQ(c->code(), 0) << all;
    }
    expectPerfTableClean(ranks[0]->out(), all);
    EXPECT_EQ(perfTransport(ranks[0]->out()), "tcp") << all;
    // The 4 MiB allreduce alone sends 2 MiB each way: the data went over the veth pair.
    const uint64_t sent = txBytes(b_, vethB_) - txBefore;
    EXPECT_GE(sent, uint64_t{2} << 20) << "rank 1 sent only " << sent << " bytes over " << vethB_;
  }

  std::string a_, b_, vethA_, vethB_;
  bool created_ = false;
};

TEST_F(Netns, AllreduceBetweenTwoHosts) {
  runPerfAcrossNamespaces(false);
}

TEST_F(Netns, AllreduceBetweenTwoHostsWithSocketIfname) {
  runPerfAcrossNamespaces(true);
}

}  // namespace
