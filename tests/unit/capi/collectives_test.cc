// Every collective, dtype and op with odd sizes, N ranks as threads over the loopback, tcp and
// shm transports (shm: rank_threads.h; needs the shm backend, fails where it cannot open),
// checked element by element against a reference computed here.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "control/algorithm_tuner.h"
#include "format/half.h"
#include "gradstream/gradstream.h"
#include "tools/support/dtype_elements.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

using support::dtypeSize;
using support::loadElement;
using support::storeElement;

// Small integers: sums, products, min and max of them are exact in every dtype, so results must
// match bit for bit.
double value(gs_redop_t op, int rank, size_t i) {
  if (op == GS_PROD)
    return ((i + static_cast<size_t>(rank)) % 4 == 0) ? 2.0 : 1.0;
  if (op == GS_MIN || op == GS_MAX)
    return static_cast<double>((i * 7 + rank * 5) % 50);
  return static_cast<double>(i % 5 + static_cast<size_t>(rank));
}

double reference(gs_dtype_t t, gs_redop_t op, int n, size_t i) {
  double acc = value(op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(op, r, i);
    if (op == GS_SUM || op == GS_AVG)
      acc += v;
    if (op == GS_PROD)
      acc *= v;
    if (op == GS_MIN)
      acc = std::min(acc, v);
    if (op == GS_MAX)
      acc = std::max(acc, v);
  }
  if (op == GS_AVG) {
    const bool integer = t == GS_INT32 || t == GS_INT64 || t == GS_UINT8;
    acc = integer ? std::trunc(acc / n) : acc / n;
    // What the library computes: the exact sum divided in the element type.
    if (t == GS_FLOAT32)
      acc = static_cast<float>(acc);
    if (t == GS_FLOAT16)
      acc = format::halfToFloat(format::floatToHalf(static_cast<float>(acc)));
    if (t == GS_BFLOAT16)
      acc = format::bf16ToFloat(format::floatToBf16(static_cast<float>(acc)));
  }
  return acc;
}

void expectBuffer(Failures& f,
                  int rank,
                  const char* what,
                  const void* buf,
                  gs_dtype_t t,
                  size_t count,
                  const std::function<double(size_t)>& want) {
  for (size_t i = 0; i < count; ++i) {
    const double got = loadElement(buf, t, i);
    if (got != want(i)) {
      f.add(std::string(what) + " rank " + std::to_string(rank) + " element " + std::to_string(i) +
            ": got " + std::to_string(got) + " want " + std::to_string(want(i)));
      return;
    }
  }
}

class CollectivesTest : public TransportRanksTest {
 protected:
  RankOptions options() const { return chunkedOptions(); }
};

const size_t kCounts[] = {0, 1, 3, 7, 1000, 4099};

void allReduceEveryDtypeAndOp(int n, const RankOptions& options) {
  Failures f;
  runRanks(n, options, [&](int rank, gs_comm_t comm) {
    for (int ti = 0; ti < 7; ++ti) {
      for (int oi = 0; oi < 5; ++oi) {
        const auto t = static_cast<gs_dtype_t>(ti);
        const auto op = static_cast<gs_redop_t>(oi);
        for (size_t count : kCounts) {
          if (t == GS_UINT8 && op == GS_PROD)
            continue;
          std::vector<uint8_t> send(count * dtypeSize(t) + 1), recv(count * dtypeSize(t) + 1, 0xcd);
          for (size_t i = 0; i < count; ++i)
            storeElement(send.data(), t, i, value(op, rank, i));
          gs_status_t s = gs_allreduce(send.data(), recv.data(), count, t, op, comm, nullptr);
          if (s != GS_OK) {
            f.add(std::string("allreduce failed: ") + gs_last_error());
            return;
          }
          expectBuffer(f, rank, "allreduce", recv.data(), t, count,
                       [&](size_t i) { return reference(t, op, n, i); });
          // In place.
          for (size_t i = 0; i < count; ++i)
            storeElement(recv.data(), t, i, value(op, rank, i));
          if (gs_allreduce(recv.data(), recv.data(), count, t, op, comm, nullptr) != GS_OK) {
            f.add(std::string("in-place allreduce failed: ") + gs_last_error());
            return;
          }
          expectBuffer(f, rank, "in-place allreduce", recv.data(), t, count,
                       [&](size_t i) { return reference(t, op, n, i); });
        }
      }
    }
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
}

TEST_P(CollectivesTest, AllReduceEveryDtypeAndOp) {
  allReduceEveryDtypeAndOp(nranks(), options());
}

// The double binary tree puts up- and down-going steps of both trees on one link, and a leaf
// sends from its buffer what its parent forwards: with many chunks per step both ends must
// still queue them alike (16 MiB on 4 ranks failed with "chunk index differs" before).
TEST_P(CollectivesTest, TreeAllReduceEveryDtypeAndOp) {
  RankOptions o = options();
  o.algo = "tree";
  allReduceEveryDtypeAndOp(nranks(), o);
}

// Halving-doubling reuses a link in a later step over other element ranges; its link queues
// must go step by step (interleaved groups stalled 4 ranks here before).
TEST_P(CollectivesTest, HalvingDoublingAllReduceEveryDtypeAndOp) {
  RankOptions o = options();
  o.algo = "halving_doubling";
  allReduceEveryDtypeAndOp(nranks(), o);
}

// Recursive doubling exchanges whole buffers and reduces in place round after round: each
// reduction into the buffer must wait for the send reading it; ranks beyond a power of two fold.
TEST_P(CollectivesTest, RecursiveDoublingAllReduceEveryDtypeAndOp) {
  RankOptions o = options();
  o.algo = "recursive_doubling";
  allReduceEveryDtypeAndOp(nranks(), o);
}

// GS_ALGO=auto remembers its choice per call size: sizes taken in turn still get their own
// (small: recursive doubling's log2 N rounds; large: a schedule that moves fewer bytes).
TEST(AutoAlgorithm, EachSizeKeepsItsOwnChoiceWhenSizesAlternate) {
  const int n = 4;
  RankOptions o;
  o.transport = "loopback";
  std::vector<std::vector<std::string>> seen(n);
  Failures f;
  runRanks(n, o, [&](int rank, gs_comm_t comm) {
    std::vector<float> small(2, 1.0f), large(size_t{4} << 20, 1.0f);
    for (int round = 0; round < 3; ++round) {
      for (std::vector<float>* buf : {&small, &large}) {
        if (gs_allreduce(buf->data(), buf->data(), buf->size(), GS_FLOAT32, GS_SUM, comm,
                         nullptr) != GS_OK) {
          f.add(std::string("allreduce: ") + gs_last_error());
          return;
        }
        gs_comm_stats_t st;
        memset(&st, 0, sizeof(st));
        st.struct_size = sizeof(st);
        if (gs_comm_stats(comm, &st) != GS_OK) {
          f.add(std::string("stats: ") + gs_last_error());
          return;
        }
        seen[rank].push_back(st.last_algorithm);
      }
    }
  });
  ASSERT_TRUE(f.list.empty()) << f.list.front();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(seen[r].size(), 6u);
    for (size_t k = 0; k < 6; ++k) {
      if (k % 2 == 0)
        EXPECT_EQ(seen[r][k], "recursive_doubling") << "rank " << r << " call " << k;
      else
        EXPECT_NE(seen[r][k], "recursive_doubling") << "rank " << r << " call " << k;
      EXPECT_EQ(seen[r][k], seen[0][k]) << "rank " << r << " call " << k;
    }
  }
}

// GS_ALGO_TUNE (control/algorithm_tuner.h), through real communicators: the first calls of a
// size try the schedules the model prices close, the same one on every rank at every call, then
// every rank keeps one and the same; results stay exact throughout. "always" tunes whatever the
// machine's cores (the default, "crowded", only where ranks outnumber them); "off" never.
std::vector<std::vector<std::string>> algorithmsPerCall(int n,
                                                        const char* tune,
                                                        int calls,
                                                        const char* transport = "loopback") {
  ScopedEnv env("GS_ALGO_TUNE", tune);
  RankOptions o;
  o.transport = transport;
  std::vector<std::vector<std::string>> seen(n);
  Failures f;
  runRanks(n, o, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(size_t{64} << 10);  // 256 KiB: schedules the model prices close
    for (int call = 0; call < calls; ++call) {
      for (size_t i = 0; i < buf.size(); ++i)
        buf[i] = static_cast<float>((i % 7) + rank + call);
      if (gs_allreduce(buf.data(), buf.data(), buf.size(), GS_FLOAT32, GS_SUM, comm, nullptr) !=
          GS_OK)
        return f.add(std::string("allreduce: ") + gs_last_error());
      for (size_t i = 0; i < buf.size(); ++i) {
        const float want = static_cast<float>(n * ((i % 7) + call) + n * (n - 1) / 2);
        if (buf[i] != want)
          return f.add("call " + std::to_string(call) + ": element " + std::to_string(i) + " is " +
                       std::to_string(buf[i]) + ", want " + std::to_string(want));
      }
      gs_comm_stats_t st;
      memset(&st, 0, sizeof(st));
      st.struct_size = sizeof(st);
      if (gs_comm_stats(comm, &st) != GS_OK)
        return f.add(std::string("stats: ") + gs_last_error());
      seen[rank].push_back(st.last_algorithm);
    }
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
  return seen;
}

TEST(AutoAlgorithm, TuningTriesTheCloseSchedulesThenEveryRankKeepsTheSameOne) {
  // Trials: at most kMaxCandidates x kBlockCalls x (kWarmUpRounds + kMeasuredRounds) calls, in
  // blocks of one schedule over 2 or more candidates.
  using gs::control::AlgorithmTuner;
  const size_t block = AlgorithmTuner::kBlockCalls;
  const size_t trials = AlgorithmTuner::kMaxCandidates * block *
                        (AlgorithmTuner::kWarmUpRounds + AlgorithmTuner::kMeasuredRounds);
  const int n = 4, calls = static_cast<int>(trials) + 8;
  const auto seen = algorithmsPerCall(n, "always", calls);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(seen[r].size(), static_cast<size_t>(calls)) << "rank " << r;
    for (int k = 0; k < calls; ++k)
      EXPECT_EQ(seen[r][k], seen[0][k]) << "rank " << r << " call " << k;
  }
  for (size_t k = 1; k < block; ++k)
    EXPECT_EQ(seen[0][k], seen[0][0]) << "call " << k << " left the first block";
  EXPECT_NE(seen[0][block], seen[0][0])
      << "the second block ran the same schedule: nothing was tried";
  for (size_t k = trials; k < static_cast<size_t>(calls); ++k)
    EXPECT_EQ(seen[0][k], seen[0][trials]) << "call " << k << " after the decision";
  const auto off = algorithmsPerCall(n, "off", 8);
  for (size_t k = 1; k < off[0].size(); ++k)
    EXPECT_EQ(off[0][k], off[0][0]) << "GS_ALGO_TUNE=off changed schedule at call " << k;
}

// The rank threads inherit this thread's CPU mask: held to one CPU, 4 ranks crowd it on any
// machine (each rank reports the CPUs it may use; the host's union is what the model counts).
class OneCpuForNewThreads {
 public:
  OneCpuForNewThreads() {
    ok_ = sched_getaffinity(0, sizeof(old_), &old_) == 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE && ok_; ++c) {
      if (CPU_ISSET(c, &old_)) {
        CPU_SET(c, &one);
        ok_ = sched_setaffinity(0, sizeof(one), &one) == 0;
        break;
      }
    }
  }
  ~OneCpuForNewThreads() {
    if (ok_)
      sched_setaffinity(0, sizeof(old_), &old_);
  }
  bool ok() const { return ok_; }

 private:
  cpu_set_t old_;
  bool ok_ = false;
};

// GS_ALGO_TUNE's default, "crowded": ranks outnumbering their host's cores are tuned, over the
// network and over shared memory alike (Communicator::tuneHere); the first block of trials runs
// one schedule, the next another. (The VM's verbs runs skip *OverShm.)
void expectTunedOnOneCpu(const char* transport) {
  OneCpuForNewThreads oneCpu;
  ASSERT_TRUE(oneCpu.ok()) << "could not hold the test to one CPU";
  const size_t block = gs::control::AlgorithmTuner::kBlockCalls;
  const auto seen = algorithmsPerCall(4, "crowded", static_cast<int>(block) + 1, transport);
  ASSERT_EQ(seen[0].size(), block + 1);
  EXPECT_NE(seen[0][0], seen[0][block])
      << "4 ranks on one CPU over " << transport << " were not tuned";
}

TEST(AutoAlgorithm, CrowdedRanksAreTunedOverTheNetwork) {
  expectTunedOnOneCpu("tcp");
}

TEST(AutoAlgorithm, CrowdedRanksAreTunedOverShm) {
  expectTunedOnOneCpu("shm");
}

// The issue-order gate (Communicator::run): a blocking call takes it with one compare-and-swap
// when nothing is queued, running or waiting, and through the queue's lock otherwise. One rank,
// three threads racing on one communicator: two loop over blocking allreduces, one issues
// non-blocking ones two at a time and waits for the second. Every result is exact, the first of
// each pair is done when the second is (issue order), and no request outlives its wait's
// deadline: a blocking call leaving the fast path while a request was queued behind it must
// wake the progress thread, or that request stays queued.
TEST(IssueOrderGate, BlockingAndNonBlockingCallsRaceOnOneRank) {
  Failures f;
  runRanks(1, RankOptions{}, [&](int, gs_comm_t comm) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    auto blocking = [&](float seed) {
      for (int i = 0; i < 3000 && std::chrono::steady_clock::now() < until; ++i) {
        const float in[3] = {seed, seed + i, seed - i};
        float out[3] = {};
        if (gs_allreduce(in, out, 3, GS_FLOAT32, GS_SUM, comm, nullptr) != GS_OK)
          return f.add(std::string("blocking allreduce: ") + gs_last_error());
        if (std::memcmp(in, out, sizeof(in)) != 0)
          return f.add("blocking allreduce result wrong");
      }
    };
    std::thread a(blocking, 1.0f), b(blocking, 1000.0f);
    for (int i = 0; i < 1500 && std::chrono::steady_clock::now() < until; ++i) {
      float first[2] = {static_cast<float>(i), 1}, second[2] = {static_cast<float>(-i), 2};
      gs_request_t r1 = nullptr, r2 = nullptr;
      if (gs_iallreduce(first, first, 2, GS_FLOAT32, GS_SUM, comm, nullptr, &r1) != GS_OK ||
          gs_iallreduce(second, second, 2, GS_FLOAT32, GS_SUM, comm, nullptr, &r2) != GS_OK) {
        f.add(std::string("iallreduce: ") + gs_last_error());
        break;
      }
      int done = 0;
      if (gs_wait(r2, 5000) != GS_OK)
        f.add(std::string("second request: ") + gs_last_error());
      else if (gs_test(r1, &done) != GS_OK || done != 1)
        f.add("the second request completed before the first");
      if (gs_wait(r1, 5000) != GS_OK)
        f.add(std::string("first request: ") + gs_last_error());
      if (first[0] != static_cast<float>(i) || second[0] != static_cast<float>(-i))
        f.add("iallreduce result wrong");
      gs_request_free(r1);
      gs_request_free(r2);
      if (!f.list.empty())
        break;
    }
    a.join();
    b.join();
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
}

// Hierarchical with 2 ranks per "host" (host names from RankOptions::perHost): ring links inside
// a host, halving-doubling links across hosts, in one plan.
TEST_P(CollectivesTest, HierarchicalAllReduceEveryDtypeAndOp) {
  RankOptions o = options();
  o.algo = "hierarchical";
  o.perHost = 2;
  allReduceEveryDtypeAndOp(nranks(), o);
}

TEST_P(CollectivesTest, ReduceScatterAllGatherBroadcast) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    for (gs_dtype_t t : {GS_FLOAT32, GS_BFLOAT16, GS_INT64}) {
      for (size_t count : kCounts) {
        const size_t es = dtypeSize(t);
        // Reduce-scatter, out of place and in place.
        std::vector<uint8_t> send(count * n * es + 1), recv(count * es + 1);
        for (size_t i = 0; i < count * n; ++i)
          storeElement(send.data(), t, i, value(GS_SUM, rank, i));
        if (gs_reduce_scatter(send.data(), recv.data(), count, t, GS_SUM, comm, nullptr) != GS_OK) {
          f.add(std::string("reduce_scatter: ") + gs_last_error());
          return;
        }
        expectBuffer(f, rank, "reduce_scatter", recv.data(), t, count,
                     [&](size_t i) { return reference(t, GS_SUM, n, rank * count + i); });
        for (size_t i = 0; i < count * n; ++i)
          storeElement(send.data(), t, i, value(GS_SUM, rank, i));
        uint8_t* own = send.data() + rank * count * es;
        if (gs_reduce_scatter(send.data(), own, count, t, GS_SUM, comm, nullptr) != GS_OK) {
          f.add(std::string("in-place reduce_scatter: ") + gs_last_error());
          return;
        }
        expectBuffer(f, rank, "in-place reduce_scatter", own, t, count,
                     [&](size_t i) { return reference(t, GS_SUM, n, rank * count + i); });
        // Allgather, out of place and in place.
        std::vector<uint8_t> mine(count * es + 1), all(count * n * es + 1);
        for (size_t i = 0; i < count; ++i)
          storeElement(mine.data(), t, i, value(GS_SUM, rank, i));
        if (gs_allgather(mine.data(), all.data(), count, t, comm, nullptr) != GS_OK) {
          f.add(std::string("allgather: ") + gs_last_error());
          return;
        }
        expectBuffer(f, rank, "allgather", all.data(), t, count * n, [&](size_t i) {
          return value(GS_SUM, static_cast<int>(i / count), i % count);
        });
        std::fill(all.begin(), all.end(), 0);
        for (size_t i = 0; i < count; ++i)
          storeElement(all.data() + rank * count * es, t, i, value(GS_SUM, rank, i));
        if (gs_allgather(all.data() + rank * count * es, all.data(), count, t, comm, nullptr) !=
            GS_OK) {
          f.add(std::string("in-place allgather: ") + gs_last_error());
          return;
        }
        expectBuffer(f, rank, "in-place allgather", all.data(), t, count * n, [&](size_t i) {
          return value(GS_SUM, static_cast<int>(i / count), i % count);
        });
        // Broadcast from every root.
        for (int root = 0; root < n; ++root) {
          std::vector<uint8_t> src(count * es + 1), dst(count * es + 1);
          for (size_t i = 0; i < count; ++i)
            storeElement(src.data(), t, i, value(GS_SUM, root, i));
          const void* in = rank == root ? src.data() : nullptr;
          if (gs_broadcast(in, dst.data(), count, t, root, comm, nullptr) != GS_OK) {
            f.add(std::string("broadcast: ") + gs_last_error());
            return;
          }
          expectBuffer(f, rank, "broadcast", dst.data(), t, count,
                       [&](size_t i) { return value(GS_SUM, root, i); });
        }
      }
    }
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
}

// Random floats: the result is bit-identical on every rank (the allgather phase forwards the
// owner's bytes) and equals the ring's reduction order exactly.
TEST_P(CollectivesTest, RandomFloatsBitIdenticalAcrossRanks) {
  const int n = nranks();
  const size_t count = 10007;
  std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto& v : inputs) {
    for (float& x : v)
      x = dist(rng);
  }
  std::vector<std::vector<float>> outputs(n, std::vector<float>(count));
  std::atomic<int> failures{0};
  RankOptions o = options();
  o.algo = "ring";  // the summation order checked below is the ring's
  runRanks(n, o, [&](int rank, gs_comm_t comm) {
    if (gs_allreduce(inputs[rank].data(), outputs[rank].data(), count, GS_FLOAT32, GS_SUM, comm,
                     nullptr) != GS_OK) {
      ++failures;
    }
  });
  ASSERT_EQ(failures.load(), 0);
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(memcmp(outputs[0].data(), outputs[r].data(), count * sizeof(float)), 0)
        << "rank " << r;
  }
  // Ring order: block j is summed starting at rank j+1, each hop adding its own value first.
  for (int j = 0; j < n; ++j) {
    const size_t base = count / n, extra = count % n;
    const size_t off = j * base + std::min<size_t>(j, extra),
                 len = base + (static_cast<size_t>(j) < extra);
    for (size_t i = off; i < off + len; ++i) {
      float acc = inputs[(j + 1) % n][i];
      for (int h = 2; h <= n; ++h)
        acc = inputs[(j + h) % n][i] + acc;
      ASSERT_EQ(outputs[0][i], acc) << "element " << i;
    }
  }
}

TEST_P(CollectivesTest, NonBlockingRequestsCompleteInOrder) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    const size_t count = 5000;
    std::vector<std::vector<float>> bufs(4, std::vector<float>(count));
    std::vector<gs_request_t> reqs(4);
    for (int k = 0; k < 4; ++k) {
      for (size_t i = 0; i < count; ++i)
        bufs[k][i] = static_cast<float>(rank + k);
      if (gs_iallreduce(bufs[k].data(), bufs[k].data(), count, GS_FLOAT32, GS_SUM, comm, nullptr,
                        &reqs[k]) != GS_OK) {
        f.add(gs_last_error());
        return;
      }
    }
    // A blocking call after the requests runs after them.
    float one = 1, total = 0;
    if (gs_allreduce(&one, &total, 1, GS_FLOAT32, GS_SUM, comm, nullptr) != GS_OK)
      f.add(gs_last_error());
    if (total != static_cast<float>(n))
      f.add("blocking allreduce after requests is wrong");
    for (int k = 0; k < 4; ++k) {
      int done = 0;
      if (gs_wait(reqs[k], -1) != GS_OK)
        f.add(gs_last_error());
      if (gs_test(reqs[k], &done) != GS_OK || done != 1)
        f.add("gs_test after wait");
      const float want = static_cast<float>(n * (n - 1) / 2 + n * k);
      if (bufs[k][count - 1] != want)
        f.add("iallreduce result wrong");
      gs_request_free(reqs[k]);
    }
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
}

// Records completion callbacks: which request, on which thread, with what status, in order.
struct Completions {
  std::mutex mutex;
  std::vector<int> order;
  std::vector<gs_status_t> status;
  std::vector<std::thread::id> threads;
  static void record(gs_status_t s, const char* /*message*/, void* user) {
    auto* slot = static_cast<std::pair<Completions*, int>*>(user);
    std::lock_guard<std::mutex> lock(slot->first->mutex);
    slot->first->order.push_back(slot->second);
    slot->first->status.push_back(s);
    slot->first->threads.push_back(std::this_thread::get_id());
  }
};

// gs_ireduce_scatter, gs_iallgather, gs_ibroadcast and gs_iallreduce queued back to back: each
// result exact, callbacks in issue order before gs_wait is ever called. Rank 0's requests are
// still pending when it registers its callbacks (the other ranks issue theirs only after that),
// so there the four must run on the progress thread; elsewhere, and with one rank, a request
// may finish first and its callback then runs at once on the caller, which is allowed.
TEST_P(CollectivesTest, EveryNonBlockingKindCompletesInOrderWithCallbacks) {
  const int n = nranks();
  Failures f;
  std::atomic<bool> rankZeroRegistered{n == 1};
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    if (rank != 0) {
      for (int i = 0; i < 15000 && !rankZeroRegistered.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const size_t count = 3001;  // per rank block: not a multiple of anything
    std::vector<float> rsIn(count * n), rsOut(count), agIn(count), agOut(count * n), bc(count),
        ar(count);
    for (size_t i = 0; i < rsIn.size(); ++i)
      rsIn[i] = static_cast<float>(i % 7 + rank);
    for (size_t i = 0; i < count; ++i) {
      agIn[i] = static_cast<float>(rank * 10 + i % 3);
      bc[i] = rank == n - 1 ? static_cast<float>(i % 11) : -1.0f;
      ar[i] = static_cast<float>(rank + 1);
    }
    Completions done;
    std::vector<std::pair<Completions*, int>> slots;
    for (int k = 0; k < 5; ++k)
      slots.emplace_back(&done, k);
    gs_request_t reqs[5] = {};
    const bool issued =
        gs_ireduce_scatter(rsIn.data(), rsOut.data(), count, GS_FLOAT32, GS_SUM, comm, nullptr,
                           &reqs[0]) == GS_OK &&
        gs_iallgather(agIn.data(), agOut.data(), count, GS_FLOAT32, comm, nullptr, &reqs[1]) ==
            GS_OK &&
        gs_ibroadcast(bc.data(), bc.data(), count, GS_FLOAT32, n - 1, comm, nullptr, &reqs[2]) ==
            GS_OK &&
        gs_iallreduce(ar.data(), ar.data(), count, GS_FLOAT32, GS_MAX, comm, nullptr, &reqs[3]) ==
            GS_OK &&
        gs_iallreduce(ar.data(), ar.data(), 0, GS_FLOAT32, GS_SUM, comm, nullptr, &reqs[4]) ==
            GS_OK;
    if (!issued) {
      f.add(gs_last_error());
      return;
    }
    for (int k = 0; k < 5; ++k) {
      if (gs_request_on_complete(reqs[k], Completions::record, &slots[k]) != GS_OK)
        f.add(gs_last_error());
    }
    if (rank == 0)
      rankZeroRegistered.store(true);
    // Wait for the callbacks alone (bounded): nobody calls gs_wait before they ran.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(done.mutex);
        if (done.order.size() == 5)
          break;
      }
      if (std::chrono::steady_clock::now() > until) {
        f.add("callbacks did not all run within 15 s");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // The count-0 request was complete at issue: its callback ran at once, on this thread. The
    // four others ran in issue order; on rank 0 (n > 1) on the progress thread.
    std::vector<int> issuedOrder;
    for (size_t i = 0; i < done.order.size(); ++i) {
      if (done.status[i] != GS_OK)
        f.add("a callback reported an error");
      if (done.order[i] == 4) {
        if (done.threads[i] != std::this_thread::get_id())
          f.add("the callback of a finished request did not run at once on the caller");
        continue;
      }
      issuedOrder.push_back(done.order[i]);
      if (rank == 0 && n > 1 && done.threads[i] == std::this_thread::get_id())
        f.add("a pending request's callback ran on the caller's thread");
    }
    if (issuedOrder != std::vector<int>({0, 1, 2, 3}))
      f.add("callbacks out of issue order");
    for (auto& r : reqs) {
      if (gs_wait(r, 0) != GS_OK)
        f.add(gs_last_error());
      gs_request_free(r);
    }
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q)
        want += static_cast<float>((rank * count + i) % 7 + q);
      if (rsOut[i] != want) {
        f.add("ireduce_scatter result wrong");
        break;
      }
    }
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; ++i) {
        if (agOut[q * count + i] != static_cast<float>(q * 10 + i % 3)) {
          f.add("iallgather result wrong");
          q = n;
          break;
        }
      }
    }
    for (size_t i = 0; i < count; ++i) {
      if (bc[i] != static_cast<float>(i % 11) || ar[i] != static_cast<float>(n)) {
        f.add("ibroadcast or iallreduce result wrong");
        break;
      }
    }
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         CollectivesTest,
                         ::testing::Combine(::testing::Values("loopback", "tcp", "shm"),
                                            ::testing::Values(1, 2, 3, 4)),
                         transportRanksName);

}  // namespace
}  // namespace gs::testing
