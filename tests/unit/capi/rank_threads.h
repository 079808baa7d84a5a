#pragma once

// Runs N ranks as threads of this process through the public C API (the Gloo BaseTest::spawn
// pattern): a real rendezvous on 127.0.0.1, then the transport under test.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"

namespace gs::testing {

struct RankOptions {
  // "loopback", "tcp" (the network path: shared memory off, although the threads share a
  // host), or "shm": tcp as the network transport with GS_SHM on, so the links between ranks
  // of one host are shared memory; runRanks() then fails a rank whose communicator does not
  // report shm (the shm transport could not open). The environment (GS_TRANSPORT, GS_SHM)
  // overrides both, as for any configuration field.
  const char* transport = "loopback";
  int64_t timeoutMs = 20000;
  int64_t chunkBytes = -1;
  int64_t slots = -1;
  const char* codec = nullptr;
  const char* codecLadder = nullptr;  // codec = "auto"
  const char* codecFloor = nullptr;
  int64_t chunkMinBytes = -1;  // codec = "auto": bounds of the chunk-size decision
  int64_t chunkMaxBytes = -1;
  const char* algo = nullptr;  // GS_ALGO
  int perHost = 0;             // > 0: ranks get host names "host<rank / perHost>"
};

/// Tests parametrized by (transport, nranks): options() for the transport, nranks().
using Param = std::tuple<const char*, int>;
class TransportRanksTest : public ::testing::TestWithParam<Param> {
 protected:
  RankOptions options() const {
    RankOptions o;
    o.transport = std::get<0>(GetParam());
    return o;
  }
  /// Small chunks and few slots: many chunks per block even for small counts.
  RankOptions chunkedOptions() const {
    RankOptions o = options();
    o.chunkBytes = 4096;
    o.slots = 4;
    return o;
  }
  int nranks() const { return std::get<1>(GetParam()); }
};

/// Test names "<transport>_<n>ranks".
inline std::string transportRanksName(const ::testing::TestParamInfo<Param>& p) {
  return std::string(std::get<0>(p.param)) + "_" + std::to_string(std::get<1>(p.param)) + "ranks";
}

/// What rank threads found wrong (the first ten), collected across threads.
struct Failures {
  std::mutex m;
  std::vector<std::string> list;
  void add(const std::string& s) {
    std::lock_guard<std::mutex> l(m);
    if (list.size() < 10)
      list.push_back(s);
  }
};

/// Creates nranks communicators on threads, runs body(rank, comm) on each, destroys them.
inline void runRanks(int nranks,
                     const RankOptions& opt,
                     const std::function<void(int, gs_comm_t)>& body) {
  gs_unique_id_t id;
  ASSERT_EQ(gs_get_unique_id(&id), GS_OK) << gs_last_error();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(nranks);
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      gs_config_t cfg;
      gs_config_init(&cfg);
      const bool overShm = strcmp(opt.transport, "shm") == 0;
      cfg.transport = overShm ? "tcp" : opt.transport;
      cfg.shm = overShm ? 1 : 0;
      cfg.timeout_ms = opt.timeoutMs;
      cfg.chunk_bytes = opt.chunkBytes;
      cfg.slots_per_peer = opt.slots;
      cfg.codec = opt.codec;
      cfg.codec_ladder = opt.codecLadder;
      cfg.codec_floor = opt.codecFloor;
      cfg.chunk_min_bytes = opt.chunkMinBytes;
      cfg.chunk_max_bytes = opt.chunkMaxBytes;
      cfg.algo = opt.algo;
      const std::string host = "host" + std::to_string(opt.perHost > 0 ? r / opt.perHost : 0);
      if (opt.perHost > 0)
        cfg.hostname = host.c_str();
      gs_comm_t comm = nullptr;
      if (gs_comm_init_rank(&comm, nranks, &id, r, &cfg) != GS_OK) {
        errors[r] = gs_last_error();
        return;
      }
      gs_comm_stats_t st;
      memset(&st, 0, sizeof(st));
      st.struct_size = sizeof(st);
      // A rank with another rank on its host (consecutive ranks share one) has a ring neighbour
      // there: it must report "shm", or "shm+tcp" when ranks are spread over host names
      // (perHost). A rank alone on its host has every link over tcp.
      const int hostSize =
          opt.perHost > 0 ? std::min(opt.perHost, nranks - r / opt.perHost * opt.perHost) : nranks;
      if (overShm && hostSize > 1 &&
          (gs_comm_stats(comm, &st) != GS_OK || strncmp(st.transport, "shm", 3) != 0)) {
        errors[r] = std::string("asked for shm, but the links are over '") + st.transport + "'";
        gs_comm_destroy(comm);
        return;
      }
      body(r, comm);
      gs_comm_destroy(comm);
    });
  }
  for (auto& t : threads)
    t.join();
  for (int r = 0; r < nranks; ++r)
    EXPECT_EQ(errors[r], "") << "rank " << r << " failed to init";
}

/// Sets an environment variable (a GS_* setting read when communicators are made) for its
/// lifetime, then restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_)
      old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace gs::testing
