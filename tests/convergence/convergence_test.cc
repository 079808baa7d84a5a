// Convergence through gradient streams: least-squares linear regression trained by plain
// gradient descent with 4 ranks (threads, public C API, loopback transport), each rank its own
// data shard. The gradient buffer goes through a gs_stream_t with small buckets; every rank
// computes its gradient range by range (like a backward pass, last "layer" first) and marks each
// range ready as soon as it is written; odd ranks mark in a different order than even ranks.
//
// Asserted (the figures are printed, README-style, by every run):
//   - raw fp32 converges (L_raw < L_0 / 10; the noise floor is not reached in kSteps by design);
//   - int4 + error feedback reaches L <= kInt4Tol * L_raw in the same number of steps;
//   - topk:0.01 + error feedback reaches L <= kTopkTol * L_raw in the same number of steps;
//   - without error feedback the same runs are measurably worse: top-k >= 2x the EF run's loss,
//     int4 >= 10x the EF run's excess loss over the raw run;
//   - error feedback conserves the dropped mass (GS_SUM and GS_AVG) and trains alike with both;
//   - all ranks hold bit-identical parameters at the end of every run;
//   - error-feedback state saved after k steps and loaded into a fresh stream reproduces step
//     k+1 bit for bit;
//   - bad arguments give a clear error, never a hang.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

constexpr int kRanks = 4;
constexpr size_t kDim = 16384;         // parameters (64 KiB of float32)
constexpr size_t kRowsPerRank = 8192;  // samples per rank: 32768 in all, 2 per parameter
constexpr int kNnzPerRow = 16;         // sparse features (keeps a step cheap on 2 cores)
constexpr double kNoise = 0.1;         // y = x.w* + kNoise * N(0, 1)
constexpr int kSteps = 300;
// Feature j is scaled by (1 + pi(j))^-kAlpha (pi a fixed permutation, scales normalized to mean
// square 1): a spread of curvatures and a heavy-tailed gradient, as in real models, so plain GD
// is still far from the noise floor after kSteps and top-k has something to select. The step is
// kLrFraction / lambda_max (lambda_max of X^T X / N by power iteration). With uniform features
// (kAlpha 0) and lr = 1 / lambda_max, top-k 1% + error feedback diverges on this deterministic
// problem (a coordinate's residual accumulates ~100 coherent steps before it is sent, then
// overshoots), which is the algorithm, not the library: it conserves the dropped mass exactly
// (ErrorFeedbackConservesDroppedMassSum).
constexpr double kAlpha = 0.25;
constexpr double kLrFraction = 0.5;
constexpr int64_t kBucketBytes = 8 << 10;  // 8 KiB: 8 buckets of 2048 elements

// Tolerances on the final loss relative to the raw run's (each test prints the measured ratio).
constexpr double kInt4Tol = 1.05;  // int4 + EF: L <= 1.05 L_raw (measured 1.0000)
constexpr double kTopkTol = 1.25;  // topk:0.01 + EF: L <= 1.25 L_raw (measured 1.019)
constexpr double kEps = 1e-6;

// One rank's shard of the design matrix, in CSR (for X w) and CSC (for X^T r, column range by
// column range, so each gradient range is computed and marked on its own).
struct Shard {
  std::vector<uint32_t> rowPtr, col;
  std::vector<float> val;
  std::vector<uint32_t> colPtr, row;
  std::vector<float> cval;
  std::vector<float> y;
};

struct Problem {
  std::vector<Shard> shards;
  std::vector<float> wStar;
  double lr = 0;
  double lambdaMax = 0;
};

Shard makeShard(int rank, const std::vector<float>& wStar) {
  Shard s;
  std::mt19937 rng(1000 + rank);
  std::uniform_int_distribution<uint32_t> pick(0, kDim - 1);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float scale = 1.f / std::sqrt(static_cast<float>(kNnzPerRow));
  const double alpha = kAlpha;
  std::vector<float> colScale(kDim);
  {
    std::vector<uint32_t> perm(kDim);
    std::iota(perm.begin(), perm.end(), 0u);
    std::mt19937 prng(3);
    std::shuffle(perm.begin(), perm.end(), prng);
    double ms = 0;
    for (size_t j = 0; j < kDim; ++j)
      ms += std::pow(1.0 + perm[j], -2 * alpha);
    ms = std::sqrt(ms / kDim);
    for (size_t j = 0; j < kDim; ++j)
      colScale[j] = static_cast<float>(std::pow(1.0 + perm[j], -alpha) / ms);
  }
  s.rowPtr.reserve(kRowsPerRank + 1);
  s.rowPtr.push_back(0);
  for (size_t i = 0; i < kRowsPerRank; ++i) {
    double dot = 0;
    for (int k = 0; k < kNnzPerRow; ++k) {
      const uint32_t j = pick(rng);
      const float v = normal(rng) * scale * colScale[j];
      s.col.push_back(j);
      s.val.push_back(v);
      dot += static_cast<double>(v) * wStar[j];
    }
    s.rowPtr.push_back(static_cast<uint32_t>(s.col.size()));
    s.y.push_back(static_cast<float>(dot + kNoise * normal(rng)));
  }
  // CSC by counting sort.
  s.colPtr.assign(kDim + 1, 0);
  for (uint32_t j : s.col)
    ++s.colPtr[j + 1];
  for (size_t j = 0; j < kDim; ++j)
    s.colPtr[j + 1] += s.colPtr[j];
  std::vector<uint32_t> fill(s.colPtr.begin(), s.colPtr.end() - 1);
  s.row.resize(s.col.size());
  s.cval.resize(s.col.size());
  for (size_t i = 0; i < kRowsPerRank; ++i) {
    for (uint32_t e = s.rowPtr[i]; e < s.rowPtr[i + 1]; ++e) {
      const uint32_t at = fill[s.col[e]]++;
      s.row[at] = static_cast<uint32_t>(i);
      s.cval[at] = s.val[e];
    }
  }
  return s;
}

// r = X w - y; returns sum of r^2.
double residuals(const Shard& s, const std::vector<float>& w, std::vector<float>& r) {
  r.resize(kRowsPerRank);
  double sum = 0;
  for (size_t i = 0; i < kRowsPerRank; ++i) {
    float dot = 0;
    for (uint32_t e = s.rowPtr[i]; e < s.rowPtr[i + 1]; ++e)
      dot += s.val[e] * w[s.col[e]];
    r[i] = dot - s.y[i];
    sum += static_cast<double>(r[i]) * r[i];
  }
  return sum;
}

// g[j] = scale * sum_i X_ij r_i for j in [lo, hi).
void gradientRange(
    const Shard& s, const std::vector<float>& r, float scale, float* g, size_t lo, size_t hi) {
  for (size_t j = lo; j < hi; ++j) {
    float acc = 0;
    for (uint32_t e = s.colPtr[j]; e < s.colPtr[j + 1]; ++e)
      acc += s.cval[e] * r[s.row[e]];
    g[j] = acc * scale;
  }
}

const Problem& problem() {
  static const Problem prob = [] {
    Problem p;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    p.wStar.resize(kDim);
    for (float& x : p.wStar)
      x = normal(rng);
    for (int r = 0; r < kRanks; ++r)
      p.shards.push_back(makeShard(r, p.wStar));
    // Largest eigenvalue of the Hessian H = X^T X / N by power iteration; lr = 1 / lambda_max.
    std::vector<float> v(kDim, 1.f), hv(kDim), tmp;
    const double n = static_cast<double>(kRanks * kRowsPerRank);
    for (int it = 0; it < 60; ++it) {
      std::fill(hv.begin(), hv.end(), 0.f);
      for (const Shard& s : p.shards) {
        tmp.assign(kRowsPerRank, 0.f);
        for (size_t i = 0; i < kRowsPerRank; ++i)
          for (uint32_t e = s.rowPtr[i]; e < s.rowPtr[i + 1]; ++e)
            tmp[i] += s.val[e] * v[s.col[e]];
        for (size_t i = 0; i < kRowsPerRank; ++i)
          for (uint32_t e = s.rowPtr[i]; e < s.rowPtr[i + 1]; ++e)
            hv[s.col[e]] += s.val[e] * tmp[i];
      }
      double norm = 0, dot = 0;
      for (size_t j = 0; j < kDim; ++j) {
        dot += static_cast<double>(hv[j]) / n * v[j];
        norm += static_cast<double>(hv[j]) * hv[j];
      }
      double vv = 0;
      for (float x : v)
        vv += static_cast<double>(x) * x;
      p.lambdaMax = dot / vv;
      norm = std::sqrt(norm);
      for (size_t j = 0; j < kDim; ++j)
        v[j] = static_cast<float>(hv[j] / norm);
    }
    p.lr = kLrFraction / p.lambdaMax;
    return p;
  }();
  return prob;
}

// "Layers": irregular ranges not aligned to buckets; a rank marks them in its own order.
std::vector<std::pair<size_t, size_t>> layers() {
  std::vector<std::pair<size_t, size_t>> out;
  std::mt19937 rng(99);
  std::uniform_int_distribution<size_t> size(97, 2900);
  for (size_t off = 0; off < kDim;) {
    const size_t n = std::min(size(rng), kDim - off);
    out.emplace_back(off, n);
    off += n;
  }
  return out;
}

std::vector<size_t> markOrder(int rank, size_t nlayers) {
  std::vector<size_t> order(nlayers);
  std::iota(order.begin(), order.end(), 0);
  if (rank % 2 == 0) {
    std::reverse(order.begin(), order.end());  // backward pass: last layer first
  } else {
    std::mt19937 rng(500 + rank);  // odd ranks: a shuffled order, different per rank
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

#define GS_OK_OR(expr, what)                                                                 \
  do {                                                                                       \
    const gs_status_t st_ = (expr);                                                          \
    if (st_ != GS_OK) {                                                                      \
      fail(rank, std::string(what) + ": " + gs_status_string(st_) + ": " + gs_last_error()); \
      return;                                                                                \
    }                                                                                        \
  } while (0)

struct RunResult {
  std::vector<double> loss;           // global loss before each step and after the last
  std::vector<std::vector<float>> w;  // final parameters per rank
  std::vector<std::string> errors;    // per rank, "" when fine
  bool ok() const {
    for (const auto& e : errors)
      if (!e.empty())
        return false;
    return true;
  }
  double final() const { return loss.back(); }
};

struct RunSpec {
  const char* codec;  // stream codec; the communicator stays raw
  bool ef;
  gs_redop_t op = GS_AVG;  // GS_SUM: the training loop divides by the rank count
};

std::string describe(const RunSpec& s) {
  return std::string(s.codec) + (s.ef ? " +EF" : " no EF") + (s.op == GS_SUM ? " (SUM)" : "");
}

// Trains kSteps of gradient descent on 4 ranks; returns the global loss curve and parameters.
RunResult train(const RunSpec& spec, int steps = kSteps) {
  const Problem& p = problem();
  const auto lay = layers();
  RunResult res;
  res.w.assign(kRanks, {});
  res.errors.assign(kRanks, "");
  std::vector<std::vector<double>> parts(kRanks, std::vector<double>(steps + 1, 0.0));
  auto fail = [&](int rank, const std::string& why) { res.errors[rank] = why; };

  RankOptions opt;
  opt.codec = "raw";
  runRanks(kRanks, opt, [&](int rank, gs_comm_t comm) {
    const Shard& s = p.shards[rank];
    std::vector<float> w(kDim, 0.f), g(kDim, 0.f), r;
    gs_stream_config_t sc;
    GS_OK_OR(gs_stream_config_init(&sc), "config_init");
    sc.bucket_bytes = kBucketBytes;
    sc.error_feedback = spec.ef ? 1 : 0;
    sc.codec = spec.codec;
    gs_stream_t stream = nullptr;
    GS_OK_OR(gs_stream_open(comm, g.data(), kDim, GS_FLOAT32, spec.op, &sc, &stream), "open");
    const auto order = markOrder(rank, lay.size());
    // Local gradient of (1/2n) ||X w - y||^2 over this shard; with GS_AVG the reduction is the
    // full-data gradient (equal shards). With GS_SUM the caller divides by the rank count.
    const float scale = 1.f / static_cast<float>(kRowsPerRank);
    const float post = spec.op == GS_SUM ? 1.f / kRanks : 1.f;
    const float lr = static_cast<float>(p.lr);
    for (int t = 0; t < steps; ++t) {
      parts[rank][t] = residuals(s, w, r);
      GS_OK_OR(gs_stream_begin(stream), "begin");
      for (size_t li : order) {
        const auto [off, n] = lay[li];
        gradientRange(s, r, scale, g.data(), off, off + n);
        GS_OK_OR(gs_stream_ready(stream, off, n), "ready");
      }
      GS_OK_OR(gs_stream_wait(stream, 30000), "wait");
      for (size_t j = 0; j < kDim; ++j)
        w[j] -= lr * (g[j] * post);
    }
    parts[rank][steps] = residuals(s, w, r);
    GS_OK_OR(gs_stream_close(stream), "close");
    res.w[rank] = std::move(w);
  });
  const double n = static_cast<double>(kRanks * kRowsPerRank);
  res.loss.assign(steps + 1, 0.0);
  for (int t = 0; t <= steps; ++t) {
    for (int rk = 0; rk < kRanks; ++rk)
      res.loss[t] += parts[rk][t];
    res.loss[t] /= 2 * n;
  }
  return res;
}

// Runs are deterministic; cache them within one process (ctest runs each test in its own).
const RunResult& run(const RunSpec& spec) {
  static std::map<std::tuple<std::string, bool, int>, RunResult> cache;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(std::string(spec.codec), spec.ef, static_cast<int>(spec.op));
  auto it = cache.find(key);
  if (it != cache.end())
    return it->second;
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = train(spec);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.ok()) {
    std::printf(
        "[convergence] %-22s loss: step0 %.6f  step50 %.6f  step100 %.6f  step%d %.6f  (%.1f s)\n",
        describe(spec).c_str(), r.loss[0], r.loss[50], r.loss[100], kSteps, r.final(), secs);
  }
  return cache.emplace(key, std::move(r)).first->second;
}

// Noise floor: E[min loss] = kNoise^2 / 2 * (1 - d / N) for the least-squares problem.
double noiseFloor() {
  return kNoise * kNoise / 2 * (1.0 - static_cast<double>(kDim) / (kRanks * kRowsPerRank));
}

void expectOkAndIdentical(const RunResult& r, const RunSpec& spec) {
  for (int rk = 0; rk < kRanks; ++rk)
    ASSERT_EQ(r.errors[rk], "") << describe(spec) << " rank " << rk;
  for (int rk = 1; rk < kRanks; ++rk) {
    ASSERT_EQ(r.w[rk].size(), r.w[0].size());
    EXPECT_EQ(std::memcmp(r.w[rk].data(), r.w[0].data(), kDim * sizeof(float)), 0)
        << describe(spec) << ": rank " << rk << " parameters differ from rank 0's";
  }
  for (double l : r.loss)
    ASSERT_TRUE(std::isfinite(l)) << describe(spec);
}

const RunSpec kRaw{"raw", false};
const RunSpec kInt4Ef{"int4", true};
const RunSpec kInt4NoEf{"int4", false};
const RunSpec kTopkEf{"topk:0.01", true};
const RunSpec kTopkNoEf{"topk:0.01", false};

TEST(Convergence, RawFp32Converges) {
  const RunResult& raw = run(kRaw);
  expectOkAndIdentical(raw, kRaw);
  std::printf("[convergence] lr %.4g (%.2g/lambda_max), noise floor ~%.6f, L_raw %.6f\n",
              problem().lr, kLrFraction, noiseFloor(), raw.final());
  EXPECT_LT(raw.final(), raw.loss[0] / 10) << "raw fp32 did not converge";
  EXPECT_GT(raw.final(), noiseFloor()) << "below the noise floor: the loss is miscomputed";
}

TEST(Convergence, Int4WithErrorFeedbackMatchesRaw) {
  const RunResult& raw = run(kRaw);
  const RunResult& q = run(kInt4Ef);
  expectOkAndIdentical(raw, kRaw);
  expectOkAndIdentical(q, kInt4Ef);
  std::printf("[convergence] int4+EF / raw = %.4f (tolerance %.2f)\n", q.final() / raw.final(),
              kInt4Tol);
  EXPECT_LE(q.final(), kInt4Tol * raw.final() + kEps);
}

TEST(Convergence, TopkWithErrorFeedbackMatchesRaw) {
  const RunResult& raw = run(kRaw);
  const RunResult& q = run(kTopkEf);
  expectOkAndIdentical(raw, kRaw);
  expectOkAndIdentical(q, kTopkEf);
  std::printf("[convergence] topk:0.01+EF / raw = %.4f (tolerance %.2f)\n", q.final() / raw.final(),
              kTopkTol);
  EXPECT_LE(q.final(), kTopkTol * raw.final() + kEps);
}

TEST(Convergence, WithoutErrorFeedbackIsMeasurablyWorse) {
  const RunResult& raw = run(kRaw);
  const RunResult& topkEf = run(kTopkEf);
  const RunResult& topkNo = run(kTopkNoEf);
  const RunResult& int4Ef = run(kInt4Ef);
  const RunResult& int4No = run(kInt4NoEf);
  for (const auto* r : {&raw, &topkEf, &topkNo, &int4Ef, &int4No})
    ASSERT_TRUE(r->ok());
  expectOkAndIdentical(topkNo, kTopkNoEf);
  expectOkAndIdentical(int4No, kInt4NoEf);
  std::printf(
      "[convergence] topk:0.01: EF %.6f, no EF %.6f (x%.2f); int4: EF %.6f, no EF %.6f "
      "(excess over raw: EF %.3g, no EF %.3g)\n",
      topkEf.final(), topkNo.final(), topkNo.final() / topkEf.final(), int4Ef.final(),
      int4No.final(), int4Ef.final() - raw.final(), int4No.final() - raw.final());
  // Top-k without feedback never sends the small coordinates: far behind, and outside the
  // tolerance the EF run meets.
  EXPECT_GE(topkNo.final(), 2.0 * topkEf.final())
      << "top-k 1% without error feedback should be far from the EF run";
  EXPECT_GT(topkNo.final(), kTopkTol * raw.final());
  // int4's rounding bias is small here, but feedback removes most of it: the excess loss over
  // the raw run is at least 10x larger without feedback (measured ~70x).
  EXPECT_GE(int4No.final() - raw.final(), 10.0 * std::max(0.0, int4Ef.final() - raw.final()))
      << "int4 without error feedback should be measurably worse than with it";
  EXPECT_GT(int4No.final(), int4Ef.final());
}

// The same training loop with GS_SUM (and the division by the rank count in the loop) must give
// the same convergence as GS_AVG: error feedback has to compensate what every encoding dropped,
// in the units of the contribution it is added to.
TEST(Convergence, ErrorFeedbackWorksAlikeWithSumAndAvg) {
  const RunSpec sum{"topk:0.01", true, GS_SUM};
  const RunResult& raw = run(kRaw);
  const RunResult& avg = run(kTopkEf);
  const RunResult& s = run(sum);
  expectOkAndIdentical(s, sum);
  std::printf("[convergence] topk:0.01+EF: AVG %.6f, SUM %.6f (raw %.6f)\n", avg.final(), s.final(),
              raw.final());
  EXPECT_LE(s.final(), kTopkTol * raw.final() + kEps);
  EXPECT_LE(avg.final(), 1.25 * s.final() + kEps);
  EXPECT_LE(s.final(), 1.25 * avg.final() + kEps);
}

TEST(Convergence, ReplicasBitIdenticalForEveryLossyCodec) {
  for (const char* codec : {"fp16", "bf16", "fp8e4m3", "int8", "int4,sr"}) {
    const RunSpec spec{codec, true};
    const RunResult r = train(spec, 20);
    expectOkAndIdentical(r, spec);
    EXPECT_LT(r.final(), r.loss[0]) << codec;
  }
}

// Error feedback conserves what was dropped: per iteration, the sum over ranks of what each
// rank put in (gradient + the residual added back) equals the reduced result (times N for
// GS_AVG) plus the sum over ranks of the new residuals, element by element (fp32 rounding aside).
// Checked with random gradients for GS_SUM and GS_AVG.
void checkConservation(const char* codec, gs_redop_t op) {
  constexpr size_t n = kDim;
  constexpr int iters = 3;
  // in[it][rank], out[it][rank] (result), res[it][rank] (residual after the iteration)
  std::vector<std::vector<std::vector<float>>> in(iters, std::vector<std::vector<float>>(kRanks)),
      res = in, out = in;
  std::vector<std::string> errors(kRanks);
  auto fail = [&](int rank, const std::string& why) { errors[rank] = why; };
  RankOptions opt;
  runRanks(kRanks, opt, [&](int rank, gs_comm_t comm) {
    std::vector<float> g(n);
    gs_stream_config_t sc;
    gs_stream_config_init(&sc);
    sc.bucket_bytes = kBucketBytes;
    sc.error_feedback = 1;
    sc.codec = codec;
    gs_stream_t st = nullptr;
    GS_OK_OR(gs_stream_open(comm, g.data(), n, GS_FLOAT32, op, &sc, &st), "open");
    std::mt19937 rng(77 + rank);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> before(n, 0.f);  // residual before the iteration
    for (int it = 0; it < iters; ++it) {
      for (float& x : g)
        x = normal(rng);
      in[it][rank].resize(n);
      for (size_t i = 0; i < n; ++i)
        in[it][rank][i] = g[i] + before[i];
      GS_OK_OR(gs_stream_begin(st), "begin");
      GS_OK_OR(gs_stream_ready(st, 0, n), "ready");
      GS_OK_OR(gs_stream_wait(st, 30000), "wait");
      out[it][rank] = g;
      res[it][rank].resize(n);
      GS_OK_OR(gs_stream_save_residual(st, res[it][rank].data(), n * sizeof(float)), "save");
      before = res[it][rank];
    }
    GS_OK_OR(gs_stream_close(st), "close");
  });
  for (int rk = 0; rk < kRanks; ++rk)
    ASSERT_EQ(errors[rk], "") << codec << " rank " << rk;
  const double mult = op == GS_AVG ? kRanks : 1.0;
  for (int it = 0; it < iters; ++it) {
    double worst = 0, scale = 0;
    size_t worstAt = 0;
    for (size_t i = 0; i < n; ++i) {
      double put = 0, kept = 0;
      for (int rk = 0; rk < kRanks; ++rk) {
        put += in[it][rk][i];
        kept += res[it][rk][i];
      }
      const double err = std::fabs(put - (mult * out[it][0][i] + kept));
      scale = std::max(scale, std::fabs(put));
      if (err > worst)
        worst = err, worstAt = i;
    }
    double kept = 0;
    for (int rk = 0; rk < kRanks; ++rk)
      kept += res[it][rk][worstAt];
    std::printf(
        "[convergence] conservation %s %s it %d: worst |sum(in) - (%g*out + sum(residual))| "
        "= %.3g at %zu (max |sum(in)| %.3g)\n",
        codec, op == GS_AVG ? "AVG" : "SUM", it, mult, worst, worstAt, scale);
    EXPECT_LE(worst, 1e-4 * scale) << codec << (op == GS_AVG ? " AVG" : " SUM") << " iteration "
                                   << it << ": element " << worstAt;
  }
}

TEST(GradientStream, ErrorFeedbackConservesDroppedMassSum) {
  checkConservation("topk:0.01", GS_SUM);
  checkConservation("int4", GS_SUM);
}

TEST(GradientStream, ErrorFeedbackConservesDroppedMassAvg) {
  checkConservation("topk:0.01", GS_AVG);
  checkConservation("int4", GS_AVG);
}

// Error-feedback state saved after k steps, loaded into a fresh stream, reproduces step k+1.
TEST(GradientStream, ResidualSaveLoadRoundTrip) {
  const Problem& p = problem();
  const auto lay = layers();
  constexpr int k = 6;
  for (const char* codec : {"topk:0.01", "int4"}) {
    std::vector<std::string> errors(kRanks);
    auto fail = [&](int rank, const std::string& why) { errors[rank] = why; };
    RankOptions opt;
    runRanks(kRanks, opt, [&](int rank, gs_comm_t comm) {
      const Shard& s = p.shards[rank];
      const float scale = 1.f / kRowsPerRank, lr = static_cast<float>(p.lr);
      const auto order = markOrder(rank, lay.size());
      std::vector<float> w(kDim, 0.f), g(kDim), r;
      gs_stream_config_t sc;
      gs_stream_config_init(&sc);
      sc.bucket_bytes = kBucketBytes;
      sc.error_feedback = 1;
      sc.codec = codec;
      auto step = [&](gs_stream_t st) -> bool {
        residuals(s, w, r);
        if (gs_stream_begin(st) != GS_OK)
          return false;
        for (size_t li : order) {
          gradientRange(s, r, scale, g.data(), lay[li].first, lay[li].first + lay[li].second);
          if (gs_stream_ready(st, lay[li].first, lay[li].second) != GS_OK)
            return false;
        }
        if (gs_stream_wait(st, 30000) != GS_OK)
          return false;
        for (size_t j = 0; j < kDim; ++j)
          w[j] -= lr * g[j];
        return true;
      };
      gs_stream_t a = nullptr;
      GS_OK_OR(gs_stream_open(comm, g.data(), kDim, GS_FLOAT32, GS_AVG, &sc, &a), "open a");
      size_t bytes = 0;
      GS_OK_OR(gs_stream_residual_bytes(a, &bytes), "residual_bytes");
      if (bytes != kDim * sizeof(float)) {
        fail(rank, "residual_bytes " + std::to_string(bytes) + ", expected " +
                       std::to_string(kDim * sizeof(float)));
        gs_stream_close(a);
        return;
      }
      for (int t = 0; t < k; ++t)
        if (!step(a))
          return fail(rank, std::string("step a: ") + gs_last_error());
      std::vector<uint8_t> saved(bytes), afterA(bytes), afterB(bytes), zero(bytes, 0);
      GS_OK_OR(gs_stream_save_residual(a, saved.data(), bytes), "save");
      const std::vector<float> wk = w;
      if (std::memcmp(saved.data(), zero.data(), bytes) == 0)
        return fail(rank, "residual is all zero after lossy steps");
      if (!step(a))
        return fail(rank, std::string("step k+1 a: ") + gs_last_error());
      const std::vector<float> wA = w;
      GS_OK_OR(gs_stream_save_residual(a, afterA.data(), bytes), "save after");
      // Wrong sizes are rejected.
      if (gs_stream_save_residual(a, afterB.data(), bytes - 1) != GS_ERR_INVALID_ARGUMENT ||
          gs_stream_load_residual(a, saved.data(), bytes + 4) != GS_ERR_INVALID_ARGUMENT)
        return fail(rank, "a wrong residual size was not GS_ERR_INVALID_ARGUMENT");
      GS_OK_OR(gs_stream_close(a), "close a");

      // A fresh stream with the saved state redoes step k+1 bit for bit.
      gs_stream_t b = nullptr;
      GS_OK_OR(gs_stream_open(comm, g.data(), kDim, GS_FLOAT32, GS_AVG, &sc, &b), "open b");
      GS_OK_OR(gs_stream_load_residual(b, saved.data(), bytes), "load");
      w = wk;
      if (!step(b))
        return fail(rank, std::string("step k+1 b: ") + gs_last_error());
      GS_OK_OR(gs_stream_save_residual(b, afterB.data(), bytes), "save b");
      GS_OK_OR(gs_stream_close(b), "close b");
      if (std::memcmp(w.data(), wA.data(), kDim * sizeof(float)) != 0)
        return fail(rank, "parameters after the reloaded step differ");
      if (afterA != afterB)
        return fail(rank, "residuals after the reloaded step differ");

      // Without the state the step differs: the residual matters.
      gs_stream_t c = nullptr;
      GS_OK_OR(gs_stream_open(comm, g.data(), kDim, GS_FLOAT32, GS_AVG, &sc, &c), "open c");
      w = wk;
      if (!step(c))
        return fail(rank, std::string("step k+1 c: ") + gs_last_error());
      GS_OK_OR(gs_stream_close(c), "close c");
      if (std::memcmp(w.data(), wA.data(), kDim * sizeof(float)) == 0)
        return fail(rank, "a fresh stream without the saved residual gave the same step");
    });
    for (int rk = 0; rk < kRanks; ++rk)
      EXPECT_EQ(errors[rk], "") << codec << " rank " << rk;
  }
}

// Bad arguments: clear errors (GS_ERR_INVALID_ARGUMENT with a message), never a hang; the stream
// stays usable afterwards. Both ranks make the same calls, so the collectives match.
TEST(GradientStream, BadArguments) {
  constexpr size_t n = 4096;
  std::vector<std::string> errors(2);
  auto fail = [&](int rank, const std::string& why) { errors[rank] = why; };
  RankOptions opt;
  runRanks(2, opt, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(n);
    gs_stream_config_t sc;
    if (gs_stream_config_init(nullptr) != GS_ERR_INVALID_ARGUMENT)
      return fail(rank, "config_init(NULL)");
    GS_OK_OR(gs_stream_config_init(&sc), "config_init");
    sc.bucket_bytes = 1024;  // 4 buckets of 256
    gs_stream_t s = nullptr;
    auto expectInvalid = [&](gs_status_t st, const char* what) -> bool {
      if (st != GS_ERR_INVALID_ARGUMENT) {
        fail(rank, std::string(what) + ": got " + gs_status_string(st) + " (" + gs_last_error() +
                       "), expected GS_ERR_INVALID_ARGUMENT");
        return false;
      }
      if (std::strlen(gs_last_error()) == 0) {
        fail(rank, std::string(what) + ": no message in gs_last_error()");
        return false;
      }
      return true;
    };
    if (!expectInvalid(gs_stream_open(nullptr, buf.data(), n, GS_FLOAT32, GS_AVG, &sc, &s),
                       "open(NULL comm)") ||
        !expectInvalid(gs_stream_open(comm, nullptr, n, GS_FLOAT32, GS_AVG, &sc, &s),
                       "open(NULL buffer)") ||
        !expectInvalid(gs_stream_open(comm, buf.data(), n, GS_FLOAT32, GS_AVG, &sc, nullptr),
                       "open(NULL out)") ||
        !expectInvalid(
            gs_stream_open(comm, buf.data(), n, static_cast<gs_dtype_t>(42), GS_AVG, &sc, &s),
            "open(bad dtype)"))
      return;
    {
      gs_stream_config_t bad = sc;
      bad.codec = "int3";
      if (!expectInvalid(gs_stream_open(comm, buf.data(), n, GS_FLOAT32, GS_AVG, &bad, &s),
                         "open(codec int3)"))
        return;
      if (std::strstr(gs_last_error(), "int3") == nullptr)
        return fail(rank,
                    std::string("unknown codec message does not name it: ") + gs_last_error());
      bad = sc;
      bad.error_feedback = 1;
      if (!expectInvalid(gs_stream_open(comm, buf.data(), n, GS_INT32, GS_SUM, &bad, &s),
                         "open(error feedback on int32)"))
        return;
    }
    if (s != nullptr)
      return fail(rank, "out_stream written on failure");
    if (!expectInvalid(gs_stream_begin(nullptr), "begin(NULL)") ||
        !expectInvalid(gs_stream_ready(nullptr, 0, 1), "ready(NULL)") ||
        !expectInvalid(gs_stream_wait(nullptr, 100), "wait(NULL)"))
      return;
    size_t rb = 0;
    if (!expectInvalid(gs_stream_residual_bytes(nullptr, &rb), "residual_bytes(NULL)"))
      return;

    GS_OK_OR(gs_stream_open(comm, buf.data(), n, GS_FLOAT32, GS_SUM, &sc, &s), "open");
    if (!expectInvalid(gs_stream_residual_bytes(s, nullptr), "residual_bytes(s, NULL)"))
      return;
    GS_OK_OR(gs_stream_residual_bytes(s, &rb), "residual_bytes");
    if (rb != 0)
      return fail(rank, "residual_bytes without error feedback is not 0");
    if (!expectInvalid(gs_stream_ready(s, 0, 1), "ready before begin") ||
        !expectInvalid(gs_stream_wait(s, 100), "wait before begin"))
      return;

    auto fill = [&](int it) {
      for (size_t i = 0; i < n; ++i)
        buf[i] = static_cast<float>((i % 7) + rank + it);
    };
    auto check = [&](int it) -> bool {  // sum over 2 ranks of (i%7) + rank + it
      for (size_t i = 0; i < n; ++i) {
        const float want = static_cast<float>(2 * ((i % 7) + it) + 1);
        if (buf[i] != want) {
          fail(rank, "iteration " + std::to_string(it) + ": element " + std::to_string(i) + " is " +
                         std::to_string(buf[i]) + ", expected " + std::to_string(want));
          return false;
        }
      }
      return true;
    };

    fill(0);
    GS_OK_OR(gs_stream_begin(s), "begin 0");
    if (!expectInvalid(gs_stream_ready(s, n - 10, 11), "ready past the end") ||
        !expectInvalid(gs_stream_ready(s, SIZE_MAX, 2), "ready offset SIZE_MAX") ||
        !expectInvalid(gs_stream_ready(s, 1, SIZE_MAX), "ready count SIZE_MAX (overflow)"))
      return;
    GS_OK_OR(gs_stream_ready(s, 1000, 100), "ready [1000,1100)");
    if (!expectInvalid(gs_stream_ready(s, 1000, 100), "range marked twice") ||
        !expectInvalid(gs_stream_ready(s, 1050, 10), "range inside a marked one") ||
        !expectInvalid(gs_stream_ready(s, 990, 20), "range overlapping a marked one's start") ||
        !expectInvalid(gs_stream_ready(s, 1099, 20), "range overlapping a marked one's end"))
      return;
    // Wait with ranges unmarked: an error at once (not a timeout after the deadline).
    {
      const auto t0 = std::chrono::steady_clock::now();
      const gs_status_t st = gs_stream_wait(s, 10000);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!expectInvalid(st, "wait with ranges unmarked"))
        return;
      if (secs > 2.0)
        return fail(rank, "wait with ranges unmarked took " + std::to_string(secs) + " s");
    }
    // begin while ranges are unmarked: an error.
    if (!expectInvalid(gs_stream_begin(s), "begin with the previous iteration unfinished"))
      return;
    // Finish the iteration; the stream still works and the result is right.
    GS_OK_OR(gs_stream_ready(s, 1100, n - 1100), "ready rest");
    GS_OK_OR(gs_stream_ready(s, 0, 1000), "ready head");
    GS_OK_OR(gs_stream_ready(s, 0, 0), "ready empty range");
    GS_OK_OR(gs_stream_wait(s, 30000), "wait 0");
    if (!check(0))
      return;
    if (!expectInvalid(gs_stream_ready(s, 0, 1), "ready after the iteration completed"))
      return;
    fill(1);
    GS_OK_OR(gs_stream_begin(s), "begin 1");
    GS_OK_OR(gs_stream_ready(s, 0, n), "ready all 1");
    GS_OK_OR(gs_stream_wait(s, 30000), "wait 1");
    if (!check(1))
      return;
    // begin after every range was marked but before wait: refused while buckets may still be
    // running; if it is accepted (the buckets had finished), the previous result must be
    // complete. Both paths then run iteration 3, so the ranks' collectives still match.
    fill(2);
    GS_OK_OR(gs_stream_begin(s), "begin 2");
    GS_OK_OR(gs_stream_ready(s, n / 2, n - n / 2), "ready back half 2");
    GS_OK_OR(gs_stream_ready(s, 0, n / 2), "ready front half 2");
    if (gs_stream_begin(s) == GS_OK) {
      if (!check(2))
        return;
    } else {
      GS_OK_OR(gs_stream_wait(s, 30000), "wait 2");
      if (!check(2))
        return;
      GS_OK_OR(gs_stream_begin(s), "begin 3");
    }
    fill(3);
    GS_OK_OR(gs_stream_ready(s, 0, n), "ready all 3");
    GS_OK_OR(gs_stream_wait(s, 30000), "wait 3");
    if (!check(3))
      return;
    GS_OK_OR(gs_stream_close(s), "close");
    {
      const gs_status_t st = gs_stream_close(nullptr);  // a no-op or an argument error
      if (st != GS_OK && st != GS_ERR_INVALID_ARGUMENT)
        return fail(rank, "close(NULL)");
    }
  });
  for (int rk = 0; rk < 2; ++rk)
    EXPECT_EQ(errors[rk], "") << "rank " << rk;
}

}  // namespace
}  // namespace gs::testing
