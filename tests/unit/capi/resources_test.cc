// A destroyed communicator leaves nothing behind, whatever happened to it: this process's open
// file descriptors, threads and /dev/shm segments are counted before and after scenarios of
// ranks as threads (success, abort in the middle of a collective, a count mismatch, requests
// failed by an abort), over tcp and over shm, and must return to where they were.
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

int countEntries(const char* dir, const std::string& prefix = "") {
  DIR* d = opendir(dir);
  if (d == nullptr)
    return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.')
      continue;
    n += prefix.empty() || strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0;
  }
  closedir(d);
  return n;
}

struct Resources {
  int fds, threads, segments;
  bool operator==(const Resources&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Resources& r) {
  return os << r.fds << " fds, " << r.threads << " threads, " << r.segments << " segments";
}

// Threads that finished their work exit on their own (the rendezvous listener's thread ends
// once the rendezvous is over), so give them a moment before counting.
Resources settle() {
  Resources r{};
  const std::string mine = "gs-" + std::to_string(getpid()) + "-";
  for (int i = 0; i < 50; ++i) {
    r = {countEntries("/proc/self/fd"), countEntries("/proc/self/task"),
         countEntries("/dev/shm", mine)};
    if (r.threads == 1)  // the test's own thread only
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return r;
}

void scenarios(const char* transport) {
  RankOptions opt;
  opt.transport = transport;
  opt.timeoutMs = 5000;
  // Success, with a non-blocking request and a gradient stream.
  runRanks(3, opt, [](int rank, gs_comm_t comm) {
    std::vector<float> a(100000, static_cast<float>(rank));
    gs_request_t req = nullptr;
    EXPECT_EQ(gs_iallreduce(a.data(), a.data(), a.size(), GS_FLOAT32, GS_SUM, comm, nullptr, &req),
              GS_OK);
    EXPECT_EQ(gs_wait(req, -1), GS_OK) << gs_last_error();
    gs_request_free(req);
    gs_stream_t s = nullptr;
    ASSERT_EQ(gs_stream_open(comm, a.data(), a.size(), GS_FLOAT32, GS_SUM, nullptr, &s), GS_OK);
    gs_stream_begin(s);
    gs_stream_ready(s, 0, a.size());
    EXPECT_EQ(gs_stream_wait(s, -1), GS_OK);
    gs_stream_close(s);
  });
  // A count mismatch: every rank fails.
  runRanks(3, opt, [](int rank, gs_comm_t comm) {
    std::vector<float> a(1000 + 100 * rank, 1.f);
    EXPECT_NE(gs_allreduce(a.data(), a.data(), a.size(), GS_FLOAT32, GS_SUM, comm, nullptr), GS_OK);
  });
  // Rank 0 aborts while its requests wait for a rank that never joins them.
  runRanks(2, opt, [](int rank, gs_comm_t comm) {
    std::vector<float> a(1 << 20, 1.f);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      return;
    }
    gs_request_t reqs[3];
    for (auto& r : reqs)
      gs_iallreduce(a.data(), a.data(), a.size(), GS_FLOAT32, GS_SUM, comm, nullptr, &r);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gs_comm_abort(comm);
    for (auto& r : reqs) {
      EXPECT_NE(gs_wait(r, 5000), GS_OK);
      gs_request_free(r);
    }
  });
}

class Resources_ : public ::testing::TestWithParam<const char*> {};

TEST_P(Resources_, NothingIsLeftAfterFaults) {
  scenarios(GetParam());  // warm-up: one-time state (logging, statics) is made here
  const Resources before = settle();
  for (int i = 0; i < 3; ++i)
    scenarios(GetParam());
  const Resources after = settle();
  EXPECT_EQ(after, before) << "before: " << before << "; after: " << after;
}

INSTANTIATE_TEST_SUITE_P(Transports, Resources_, ::testing::Values("tcp", "shm"));

}  // namespace
}  // namespace gs::testing
