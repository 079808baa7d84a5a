// Gradient streams through the C API: buckets reduced as ranges become ready (in different
// orders on different ranks), and error feedback making a lossy codec unbiased over iterations.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

float grad(int rank, size_t i) {
  return std::sin(0.001f * static_cast<float>(i * (rank + 1))) + 0.1f * rank;
}

TEST(GradientStream, ReducesEveryRangeWhateverTheOrder) {
  const int n = 3;
  const size_t count = 10007;
  std::vector<std::vector<float>> out(n);
  std::vector<std::string> errors(n);
  runRanks(n, RankOptions{}, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(count);
    gs_stream_config_t cfg;
    gs_stream_config_init(&cfg);
    cfg.bucket_bytes = 4096;
    gs_stream_t s = nullptr;
    if (gs_stream_open(comm, buf.data(), count, GS_FLOAT32, GS_SUM, &cfg, &s) != GS_OK) {
      errors[rank] = gs_last_error();
      return;
    }
    for (int iter = 0; iter < 3; ++iter) {
      for (size_t i = 0; i < count; ++i)
        buf[i] = grad(rank, i) * static_cast<float>(iter + 1);
      gs_stream_begin(s);
      // Ranges of 1000: rank 0 marks them last first, rank 1 first first, rank 2 interleaved.
      std::vector<size_t> starts;
      for (size_t off = 0; off < count; off += 1000)
        starts.push_back(off);
      if (rank == 0)
        std::reverse(starts.begin(), starts.end());
      if (rank == 2)
        std::rotate(starts.begin(), starts.begin() + 4, starts.end());
      for (size_t off : starts) {
        if (gs_stream_ready(s, off, std::min<size_t>(1000, count - off)) != GS_OK)
          errors[rank] = gs_last_error();
      }
      if (gs_stream_wait(s, -1) != GS_OK)
        errors[rank] = gs_last_error();
    }
    out[rank] = buf;
    gs_stream_close(s);
  });
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(errors[r], "") << "rank " << r;
  for (size_t i = 0; i < count; i += 101) {
    const float want = 3.f * (grad(0, i) + grad(1, i) + grad(2, i));
    ASSERT_NEAR(out[0][i], want, 1e-4f * (1 + std::fabs(want))) << i;
  }
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(memcmp(out[0].data(), out[r].data(), count * 4), 0);
}

TEST(GradientStream, MisuseIsAnErrorNotAHang) {
  runRanks(1, RankOptions{}, [&](int, gs_comm_t comm) {
    std::vector<float> buf(100);
    gs_stream_t s = nullptr;
    ASSERT_EQ(gs_stream_open(comm, buf.data(), 100, GS_FLOAT32, GS_SUM, nullptr, &s), GS_OK);
    EXPECT_EQ(gs_stream_ready(s, 0, 10), GS_ERR_INVALID_ARGUMENT) << "ready before begin";
    ASSERT_EQ(gs_stream_begin(s), GS_OK);
    EXPECT_EQ(gs_stream_ready(s, 90, 20), GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("outside"), std::string::npos) << gs_last_error();
    EXPECT_EQ(gs_stream_ready(s, 0, 50), GS_OK);
    EXPECT_EQ(gs_stream_ready(s, 40, 5), GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("overlaps"), std::string::npos) << gs_last_error();
    EXPECT_EQ(gs_stream_wait(s, 100), GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("never marked"), std::string::npos)
        << gs_last_error();
    EXPECT_EQ(gs_stream_ready(s, 50, 50), GS_OK);
    EXPECT_EQ(gs_stream_wait(s, 5000), GS_OK);
    EXPECT_EQ(gs_stream_close(s), GS_OK);
    gs_stream_config_t cfg;
    gs_stream_config_init(&cfg);
    cfg.error_feedback = 1;
    std::vector<int32_t> ints(10);
    EXPECT_EQ(gs_stream_open(comm, ints.data(), 10, GS_INT32, GS_SUM, &cfg, &s),
              GS_ERR_INVALID_ARGUMENT);
    cfg.error_feedback = 0;
    cfg.codec = "int5";
    EXPECT_EQ(gs_stream_open(comm, buf.data(), 100, GS_FLOAT32, GS_SUM, &cfg, &s),
              GS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(gs_stream_close(nullptr), GS_OK);
  });
}

struct IterationDone {
  std::atomic<int> calls{0};
  std::atomic<int> status{1};
  std::thread::id thread;
  static void record(gs_status_t st, const char* /*message*/, void* user) {
    auto* d = static_cast<IterationDone*>(user);
    d->thread = std::this_thread::get_id();
    d->status.store(st);
    d->calls.fetch_add(1);
  }
  bool waitFor(int calls) const {  // bounded: 15 s
    for (int i = 0; i < 15000 && this->calls.load() < calls; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return this->calls.load() >= calls;
  }
};

// gs_stream_on_complete ends an iteration without blocking: the callback runs once per iteration
// after every bucket is reduced, and the next iteration starts without a gs_stream_wait. Rank 1
// marks its ranges only after rank 0 registered, so rank 0's buckets are still pending then and
// its callback must run on the progress thread (rank 1's may run at once on the caller).
TEST(GradientStream, OnCompleteEndsTheIterationWithoutBlocking) {
  const int n = 2;
  const size_t count = 10007;
  std::vector<std::string> errors(n);
  std::atomic<int> registered{0};  // the last iteration rank 0 registered its callback for
  runRanks(n, RankOptions{}, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(count);
    gs_stream_config_t cfg;
    gs_stream_config_init(&cfg);
    cfg.bucket_bytes = 8192;  // 5 buckets
    gs_stream_t s = nullptr;
    ASSERT_EQ(gs_stream_open(comm, buf.data(), count, GS_FLOAT32, GS_SUM, &cfg, &s), GS_OK);
    IterationDone done;
    for (int iter = 1; iter <= 3; ++iter) {
      for (size_t i = 0; i < count; ++i)
        buf[i] = grad(rank, i) * static_cast<float>(iter);
      ASSERT_EQ(gs_stream_begin(s), GS_OK) << gs_last_error();
      for (int i = 0; rank == 1 && i < 15000 && registered.load() < iter; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ASSERT_EQ(gs_stream_ready(s, 0, count / 2), GS_OK);
      EXPECT_EQ(gs_stream_on_complete(s, IterationDone::record, &done), GS_ERR_INVALID_ARGUMENT)
          << "on_complete with ranges not marked";
      EXPECT_NE(std::string(gs_last_error()).find("never marked"), std::string::npos);
      ASSERT_EQ(gs_stream_ready(s, count / 2, count - count / 2), GS_OK);
      ASSERT_EQ(gs_stream_on_complete(s, IterationDone::record, &done), GS_OK) << gs_last_error();
      if (rank == 0)
        registered.store(iter);
      if (!done.waitFor(iter)) {
        errors[rank] = "callback did not run within 15 s";
        break;
      }
      EXPECT_EQ(done.calls.load(), iter) << "one callback per iteration";
      EXPECT_EQ(done.status.load(), GS_OK);
      if (rank == 0)
        EXPECT_NE(done.thread, std::this_thread::get_id()) << "ran on the caller, not the "
                                                              "progress thread";
      for (size_t i = 0; i < count; i += 97) {
        const float want = static_cast<float>(iter) * (grad(0, i) + grad(1, i));
        if (std::fabs(buf[i] - want) > 1e-4f * (1 + std::fabs(want))) {
          errors[rank] = "wrong sum at element " + std::to_string(i);
          break;
        }
      }
    }
    gs_stream_close(s);
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The same gradient every iteration: with int4 and no feedback each iteration makes the same
// rounding error, so the running mean stays biased; with feedback the dropped part is sent
// later and the running mean converges to the exact sum.
// commCodec: the communicator's codec, which the stream's own (int4) overrides.
double meanError(bool errorFeedback, const char* commCodec = nullptr) {
  const int n = 2, iters = 40;
  const size_t count = 4096;
  std::vector<double> meanErr(n);
  RankOptions opt;
  opt.codec = commCodec;
  runRanks(n, opt, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(count);
    std::vector<double> acc(count, 0.0);
    gs_stream_config_t cfg;
    gs_stream_config_init(&cfg);
    cfg.codec = "int4";
    cfg.error_feedback = errorFeedback ? 1 : 0;
    cfg.bucket_bytes = 8192;
    gs_stream_t s = nullptr;
    ASSERT_EQ(gs_stream_open(comm, buf.data(), count, GS_FLOAT32, GS_SUM, &cfg, &s), GS_OK)
        << gs_last_error();
    for (int it = 0; it < iters; ++it) {
      for (size_t i = 0; i < count; ++i)
        buf[i] = grad(rank, i);
      ASSERT_EQ(gs_stream_begin(s), GS_OK);
      ASSERT_EQ(gs_stream_ready(s, 0, count), GS_OK);
      ASSERT_EQ(gs_stream_wait(s, -1), GS_OK) << gs_last_error();
      for (size_t i = 0; i < count; ++i)
        acc[i] += buf[i];
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < count; ++i) {
      const double want = grad(0, i) + grad(1, i);
      num += (acc[i] / iters - want) * (acc[i] / iters - want);
      den += want * want;
    }
    meanErr[rank] = std::sqrt(num / den);
    size_t bytes = 0;
    gs_stream_residual_bytes(s, &bytes);
    EXPECT_EQ(bytes, errorFeedback ? count * sizeof(float) : 0u);
    gs_stream_close(s);
  });
  return meanErr[0];
}

TEST(GradientStream, ErrorFeedbackRemovesTheBiasOfALossyCodec) {
  const double without = meanError(false), with = meanError(true);
  printf("int4 running-mean relative error: without feedback %.4g, with %.4g\n", without, with);
  EXPECT_GT(without, 0.02);
  EXPECT_LT(with, without / 5);
}

// A stream's codec is its buckets' codec even where the communicator has another: bf16 would
// leave a running-mean error near 1e-3, int4's bias is far above it.
TEST(GradientStream, TheStreamsCodecStandsOverTheCommunicators) {
  const double err = meanError(false, "bf16");
  printf("stream int4 over communicator bf16: running-mean relative error %.4g\n", err);
  EXPECT_GT(err, 0.02);
}

}  // namespace
}  // namespace gs::testing
