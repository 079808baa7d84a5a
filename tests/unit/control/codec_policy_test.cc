// The codec/chunk policy fed synthetic link measurements with an injected clock: each
// "collective" is one observation whose goodput comes from a model of the link and encoder.
#include "control/codec_policy.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace gs::control {
namespace {

using std::chrono::milliseconds;
using TimePoint = std::chrono::steady_clock::time_point;

// Ladder raw, bf16, fp8, int8, int4: wire bytes per logical byte.
constexpr double kRatio[] = {1.0, 0.5, 0.254, 0.254, 0.129};

// A link of `linkBytesPerSecond` and a pipeline whose CPU moves `cpuBytesPerSecond[rung]`
// logical bytes per second: a collective of `bytes` takes the slower of the two.
struct Model {
  double linkBytesPerSecond;
  std::vector<double> cpuBytesPerSecond;
  double rtt = 0.0001;
  double error = 0.01;  // sampled relative error of every lossy rung

  LinkObservation collective(TimePoint now, int rung, uint64_t bytes) const {
    const double wire = bytes * kRatio[rung];
    const double linkTime = wire / linkBytesPerSecond;
    const double cpuTime = bytes / cpuBytesPerSecond[rung];
    LinkObservation o;
    o.now = now;
    o.rung = rung;
    o.logicalBytes = bytes;
    o.wireBytes = static_cast<uint64_t>(wire);
    o.busySeconds = std::max(linkTime, cpuTime);
    // Waiting for credits is what the link makes the sender do beyond its own work.
    o.creditWaitSeconds = std::max(0.0, linkTime - cpuTime);
    o.encodeSeconds = rung == 0 ? 0 : bytes / (4 * cpuBytesPerSecond[rung]);
    o.rttSeconds = linkTime > cpuTime ? rtt * 20 : rtt;
    if (rung > 0) {
      o.errorSamples = 4;
      o.sampledError = error;
    }
    return o;
  }
};

struct Sim {
  CodecPolicy policy;
  TimePoint now{};
  std::vector<int> rungs;  // rung used by each collective
  double seconds = 0;

  explicit Sim(CodecPolicyConfig c = config()) : policy(c, 1 << 20) {}
  static CodecPolicyConfig config() {
    CodecPolicyConfig c;
    c.rungs = 5;
    return c;
  }
  void run(const Model& m, int collectives, uint64_t bytes = 64 << 20) {
    for (int i = 0; i < collectives; ++i) {
      const int rung = policy.current().rung;
      const LinkObservation o = m.collective(now, rung, bytes);
      rungs.push_back(rung);
      seconds += o.busySeconds;
      now += std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(o.busySeconds));
      policy.observe(o);
    }
  }
  int last() const { return policy.current().rung; }
};

// This machine's shape: CPU-bound pipelines near 0.4 GB/s, bf16 slower than raw.
const std::vector<double> kCpu = {0.45e9, 0.35e9, 0.45e9, 0.45e9, 0.45e9};

TEST(CodecPolicy, FastIdleLinkStaysRaw) {
  // A link far faster than every codec: the encoder is the bottleneck, nothing waits on the
  // link, so the policy never even probes.
  Sim sim;
  Model m{25e9, {12e9, 8e9, 6e9, 6e9, 5e9}};
  sim.run(m, 200);
  EXPECT_TRUE(std::all_of(sim.rungs.begin(), sim.rungs.end(), [](int r) { return r == 0; }));
}

TEST(CodecPolicy, SlowLinkStepsDownToTheFastestRungWithinAFewCollectives) {
  Sim sim;
  Model m{125e6, kCpu};  // 1 Gbit/s
  sim.run(m, 6);
  EXPECT_GE(sim.last(), 2) << "still at rung " << sim.last() << " after 6 collectives";
  sim.run(m, 40);
  // int8 moves as many bytes as fp8: the margin keeps the more precise fp8.
  EXPECT_EQ(sim.last(), 2);
  const long atRaw = std::count(sim.rungs.begin() + 10, sim.rungs.end(), 0);
  EXPECT_LE(atRaw, 2) << "probes back to raw should be rare";
}

// RoCE with DCQCN: the NIC paces itself on CNPs, so neither credit waits nor an rtt show the
// congestion; the ECN marks and CNPs of the port's counters do.
TEST(CodecPolicy, RoceCongestionMarksAloneMakeTheLinkCountAsTheBottleneck) {
  for (const bool marked : {false, true}) {
    Sim sim;
    Model m{125e6, kCpu};
    for (int i = 0; i < 20; ++i) {
      const int rung = sim.policy.current().rung;
      LinkObservation o = m.collective(sim.now, rung, 64 << 20);
      o.creditWaitSeconds = 0;
      o.rttSeconds = 0;
      o.congestionMarks = marked ? 1000 : 0;
      sim.rungs.push_back(rung);
      sim.now += std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(o.busySeconds));
      sim.policy.observe(o);
    }
    if (marked)
      EXPECT_GE(sim.last(), 2) << "congestion marks did not make the policy compress";
    else
      EXPECT_EQ(sim.last(), 0) << "nothing said the link was the bottleneck";
  }
}

TEST(CodecPolicy, CpuBoundLinkReturnsToRawAfterProbing) {
  // The link is slower than raw's pipeline only a little: compression saves nothing, so after
  // a probe it goes back to raw and does not probe again soon.
  Sim sim;
  Model m{0.5e9, kCpu};
  sim.run(m, 60);
  EXPECT_EQ(sim.last(), 0);
  const long compressed =
      std::count_if(sim.rungs.begin(), sim.rungs.end(), [](int r) { return r; });
  EXPECT_LE(compressed, 6) << "probes must back off";
}

TEST(CodecPolicy, RateCutAndRecovery) {
  Sim sim;
  const Model fast{0.5e9, kCpu}, slow{62.5e6, kCpu};  // 4 Gbit/s, 0.5 Gbit/s
  sim.run(fast, 10);
  EXPECT_EQ(sim.last(), 0);
  sim.rungs.clear();
  sim.run(slow, 5);
  EXPECT_GE(sim.last(), 2) << "no step down within 5 collectives of the cut";
  sim.run(slow, 10);
  EXPECT_GE(sim.last(), 2);
  // The recovery may come in the middle of a probe down, whose verdict then credits the lower
  // rung with the recovery's gain; the look back up waits a back-off scaled to raw's window.
  sim.rungs.clear();
  const TimePoint recovery = sim.now;
  while (sim.last() != 0 && sim.now - recovery < std::chrono::seconds(10))
    sim.run(fast, 1);
  EXPECT_EQ(sim.last(), 0) << "not back at raw 10 s after the recovery";
  EXPECT_LT(sim.now - recovery, std::chrono::seconds(2)) << "back at raw, but later than 2 s";
  sim.run(fast, 20);
  EXPECT_EQ(sim.last(), 0);
}

// A clean-clone CI run of congestion.ratecut: on the fast link the probes down kept failing
// (the link held raw back, but bf16 cost more CPU than it saved), so the back-off had grown to
// seconds; then the rate was cut. A 64 MiB window at the cut rate takes over a second, so by the
// time the second one could confirm the first, raw's estimate was too old to compare with and
// was simply replaced: nothing looked changed, and the back-off held raw for 8 s of the cut.
TEST(CodecPolicy, ACutAfterAGrownBackOffStillStepsDownPromptly) {
  Sim sim;
  const Model fast{0.42e9, kCpu};  // link-bound at raw, yet bf16 (0.35 GB/s of CPU) is slower
  sim.run(fast, 100);              // 15 s: failed probes push the back-off to 8-16 s
  // The cut comes right after the next failed probe: the one after it is a back-off away.
  bool probed = false;
  for (int i = 0; i < 200 && !(probed && sim.last() == 0); ++i) {
    sim.run(fast, 1);
    probed |= sim.last() != 0;
  }
  ASSERT_TRUE(probed);
  ASSERT_EQ(sim.last(), 0);
  const TimePoint cut = sim.now;
  const Model slow{62.5e6, kCpu};
  while (sim.last() == 0 && sim.now - cut < std::chrono::seconds(20))
    sim.run(slow, 1);
  EXPECT_GE(sim.last(), 1) << "still raw 20 s after the cut";
  EXPECT_LT(sim.now - cut, std::chrono::seconds(4)) << "stepped down, but later than 4 s";
}

// The trace of a congestion.ratecut run that stayed compressed: the recovery came just as the
// policy stepped from bf16 to fp8, a rung never measured before, so nothing looked changed.
// raw and bf16 kept the figures of the cut; every probe up then tried fp8, which this CPU runs
// slower than int8, and the link stayed at int8 although raw was now the fastest. Figures age:
// once raw's is stale a probe up tries raw again.
TEST(CodecPolicy, RecoveryDuringAProbeToAnUnmeasuredRungStillReturnsToRaw) {
  CodecPolicy policy(Sim::config(), 1 << 20);
  TimePoint now{};
  // Logical GB/s per rung; every window link-bound (credit waits), as on the busy 2-core host.
  const double cut[] = {0.06e9, 0.11e9, 0.11e9, 0.11e9, 0.11e9};
  const double recovered[] = {2.0e9, 1.0e9, 1.1e9, 1.65e9, 1.75e9};
  auto window = [&](const double* goodput) {
    const int rung = policy.current().rung;
    LinkObservation o;
    o.now = now;
    o.rung = rung;
    o.logicalBytes = 64 << 20;
    o.busySeconds = static_cast<double>(o.logicalBytes) / goodput[rung];
    o.wireBytes = static_cast<uint64_t>(o.logicalBytes * kRatio[rung]);
    o.creditWaitSeconds = 0.2 * o.busySeconds;
    now += std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(o.busySeconds));
    policy.observe(o);
  };
  // The cut: down from raw until the policy moves on to fp8 (not measured yet).
  for (int i = 0; i < 20 && policy.current().rung < 2; ++i)
    window(cut);
  ASSERT_EQ(policy.current().rung, 2) << "the cut should reach fp8";
  ASSERT_EQ(policy.estimate(2), 0) << "fp8 not measured during the cut";
  const TimePoint recovery = now;
  bool raw = false;
  while (!raw && now - recovery < std::chrono::seconds(10)) {
    window(recovered);
    raw = policy.current().rung == 0;
  }
  EXPECT_TRUE(raw) << "still at rung " << policy.current().rung << " 10 s after the recovery";
  EXPECT_LT(now - recovery, std::chrono::seconds(5)) << "back at raw, but later than 5 s";
}

TEST(CodecPolicy, HysteresisBetweenRungsOfSimilarSpeed) {
  // Two rungs within the margin of each other, noisy: the rung must not alternate.
  Sim sim;
  Model m{125e6, {0.5e9, 0.5e9, 0.5e9, 0.5e9, 0.5e9}};
  sim.run(m, 10);
  sim.rungs.clear();
  for (int i = 0; i < 200; ++i) {
    Model noisy = m;
    noisy.linkBytesPerSecond *= (i % 3 == 0) ? 1.15 : 0.9;
    sim.run(noisy, 1);
  }
  // Settled on one rung; the rest are spaced-out probes.
  std::vector<int> hist(5);
  for (int r : sim.rungs)
    ++hist[r];
  EXPECT_GE(*std::max_element(hist.begin(), hist.end()), 180);
}

// congestion.ratecut's failure on an unshaped veth of a shared 2-core host: raw and bf16 within
// 10 % of each other, every 64 MiB window +-30 % off its mean and "link-bound" (the receiver's
// CPU makes the sender wait for credits). A fixed 1.25 margin let noise alone trade raw for bf16
// and back every 50-200 ms; the noise-scaled margin and the dwell keep raw for most of the time.
TEST(CodecPolicy, NoisyWindowsOfTwoCloseRungsDoNotFlipTheRung) {
  CodecPolicy policy(Sim::config(), 1 << 20);
  std::mt19937 random(7);
  std::lognormal_distribution<double> noise(0, 0.25);
  const double mean[] = {1.6e9, 1.45e9, 1.3e9, 1.3e9, 1.2e9};
  TimePoint now{};
  const TimePoint end = now + std::chrono::seconds(20);
  double atRaw = 0, total = 0;
  int moves = 0;
  while (now < end) {
    const int rung = policy.current().rung;
    LinkObservation o;
    o.now = now;
    o.rung = rung;
    o.logicalBytes = 64 << 20;
    o.busySeconds = static_cast<double>(o.logicalBytes) / (mean[rung] * noise(random));
    o.wireBytes = static_cast<uint64_t>(o.logicalBytes * kRatio[rung]);
    o.creditWaitSeconds = 0.1 * o.busySeconds;
    now += std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(o.busySeconds));
    total += o.busySeconds;
    atRaw += rung == 0 ? o.busySeconds : 0;
    moves += policy.observe(o).rung != rung;
  }
  EXPECT_GE(atRaw / total, 0.9) << moves << " rung changes in 20 s";
  // Probes down back off (0.5 s doubling to 16 s, from the start where noise looks like a
  // change); each is one move down and one back. The fixed margin made 116 moves here; 100 seeds
  // of this model under the policy: at most 24.
  EXPECT_LE(moves, 30);
}

TEST(CodecPolicy, ErrorBudgetMovesUpAndStaysThere) {
  Sim sim;
  Model m{125e6, kCpu};
  sim.run(m, 10);
  // Compressed, though the tenth collective may be a probe up.
  for (int i = 0; i < 5 && sim.last() < 2; ++i)
    sim.run(m, 1);
  ASSERT_GE(sim.last(), 2);
  m.error = 0.2;  // over the 0.05 budget at every lossy rung
  sim.run(m, 2);
  EXPECT_LT(sim.last(), 2);
  sim.run(m, 20);
  EXPECT_EQ(sim.last(), 0) << "every lossy rung breaks the budget: only raw is left";
  EXPECT_TRUE(sim.policy.banned(1, sim.now));
}

TEST(CodecPolicy, FloorIsNeverPassed) {
  CodecPolicyConfig c = Sim::config();
  c.rungs = 2;  // raw, bf16 (floor)
  Sim sim(c);
  sim.run(Model{10e6, kCpu}, 30);
  EXPECT_GE(std::count(sim.rungs.begin(), sim.rungs.end(), 1), 22);  // the rest: probes up
  EXPECT_TRUE(std::all_of(sim.rungs.begin(), sim.rungs.end(), [](int r) { return r <= 1; }));
}

TEST(CodecPolicy, SmallCollectivesArePooledIntoWindows) {
  Sim sim;
  Model m{125e6, kCpu};
  // 4 KiB collectives take 33 us each: 50 ms of them before a single decision.
  sim.run(m, 1000, 4096);
  EXPECT_EQ(sim.last(), 0);
  sim.run(m, 3000, 4096);
  EXPECT_GE(sim.last(), 1);
}

TEST(CodecPolicy, ChunkSizeFollowsGoodputWithinBounds) {
  Sim sim;
  sim.run(Model{10e9, {12e9, 8e9, 6e9, 6e9, 5e9}}, 40);
  EXPECT_EQ(sim.policy.current().chunkBytes, 2 << 20);  // bounded by chunkMaxBytes
  sim.run(Model{20e6, kCpu}, 40);
  EXPECT_EQ(sim.policy.current().chunkBytes, 256 << 10);  // bounded by chunkMinBytes
}

}  // namespace
}  // namespace gs::control
