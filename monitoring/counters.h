#pragma once

// Hot-path counters of the monitoring module. Header-only and free of prometheus-cpp: the
// engine includes this file and only performs relaxed atomic adds and stores on these structs
// (no locks, no allocation, no library calls beyond one coarse clock read). The exporter and
// Metrics::snapshot() read the same atomics at scrape time.

#include <time.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace gs::monitoring {

/// Codec ids as counted by LinkCounters::onChunkSent; index into kCodecNames. The order is the
/// precision ladder (README "Adaptive codec"), so a larger id means a more aggressive codec.
inline constexpr int kMaxCodecs = 8;
inline constexpr std::array<const char*, kMaxCodecs> kCodecNames = {
    "raw", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int4", "topk"};

/// Wall-clock time in nanoseconds since the Unix epoch from CLOCK_REALTIME_COARSE: a few ns
/// per call through the vDSO, with jiffy resolution (1-4 ms), plenty for stall detection in
/// seconds. Wall clock (not steady) because Prometheus compares it with time().
inline uint64_t unixNowNsCoarse() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

/// A fixed-bucket histogram of durations in nanoseconds, cumulative only at read time.
/// `Bounds` is a sorted array of upper bounds (inclusive, ns); one extra bucket holds +Inf.
/// observe() is wait-free (relaxed atomics); concurrent readers may see a count and a sum
/// from slightly different instants, which Prometheus tolerates.
template <size_t N>
struct DurationHistogram {
  static constexpr size_t kBuckets = N + 1;  // the last one is +Inf
  std::array<std::atomic<uint64_t>, kBuckets> counts{};
  std::atomic<uint64_t> sumNs{0};

  void observe(const std::array<uint64_t, N>& boundsNs, uint64_t ns) noexcept {
    size_t i = 0;
    while (i < N && ns > boundsNs[i]) {
      ++i;
    }
    counts[i].fetch_add(1, std::memory_order_relaxed);
    sumNs.fetch_add(ns, std::memory_order_relaxed);
  }
};

/// Chunk post-to-completion latency buckets: 10 us .. 1 s in half-decade steps.
inline constexpr std::array<uint64_t, 11> kChunkLatencyBoundsNs = {
    10'000,     31'623,     100'000,     316'228,     1'000'000,    3'162'278,
    10'000'000, 31'622'777, 100'000'000, 316'227'766, 1'000'000'000};
using ChunkLatencyHistogram = DurationHistogram<kChunkLatencyBoundsNs.size()>;

/// Collective duration buckets: 10 us .. 100 s in half-decade steps.
inline constexpr std::array<uint64_t, 15> kCollectiveBoundsNs = {
    10'000,        31'623,        100'000,        316'228,        1'000'000,
    3'162'278,     10'000'000,    31'622'777,     100'000'000,    316'227'766,
    1'000'000'000, 3'162'277'660, 10'000'000'000, 31'622'776'602, 100'000'000'000};
using CollectiveHistogram = DurationHistogram<kCollectiveBoundsNs.size()>;

/// Counters of one link (this rank <-> one peer) of one communicator. Created by
/// Metrics::addLink() at setup; its address stays valid for the Metrics object's lifetime.
///
/// Thread safety: every member is an atomic. Writers (the engine thread; a second writer such
/// as a receive thread is also safe) use the inline methods below, which are wait-free and
/// never allocate; readers (scrape thread, snapshot()) load with relaxed order.
struct alignas(64) LinkCounters {
  explicit LinkCounters(int peerRank) noexcept : peer(peerRank) {
    lastProgressUnixNs.store(unixNowNsCoarse(), std::memory_order_relaxed);
  }
  LinkCounters(const LinkCounters&) = delete;
  LinkCounters& operator=(const LinkCounters&) = delete;

  const int peer;

  // One atomic per row of link_counters.inc (what each one counts is said there).
#define GS_LINK_COUNTER(type, field, metric, kind, scale, help) std::atomic<type> field{0};
#define GS_LINK_CODEC_COUNTERS(type, field, metric, kind, help) \
  std::array<std::atomic<type>, kMaxCodecs> field{};
#define GS_LINK_HISTOGRAM(field, metric, help) ChunkLatencyHistogram field;
#define GS_LINK_INTERNAL(type, field) std::atomic<type> field{0};
#define GS_LINK_INTERNAL_CODECS(type, field) std::array<std::atomic<type>, kMaxCodecs> field{};
#include "monitoring/link_counters.inc"

  /// One chunk handed to the transport. codecId outside [0, kMaxCodecs) counts as raw.
  void onChunkSent(uint64_t logical, uint64_t wire, int codecId) noexcept {
    bytesLogical.fetch_add(logical, std::memory_order_relaxed);
    bytesWire.fetch_add(wire, std::memory_order_relaxed);
    chunksSent.fetch_add(1, std::memory_order_relaxed);
    unsigned idx = static_cast<unsigned>(codecId);
    chunksByCodec[idx < kMaxCodecs ? idx : 0].fetch_add(1, std::memory_order_relaxed);
  }
  /// A sent chunk completed locally (its buffer may be reused); counts as progress.
  void onChunkCompleted(uint64_t latencyNs) noexcept {
    chunkLatency.observe(kChunkLatencyBoundsNs, latencyNs);
    touch();
  }
  /// A chunk arrived from the peer (wire bytes); counts as progress.
  void onChunkReceived(uint64_t wireBytes) noexcept {
    chunksReceived.fetch_add(1, std::memory_order_relaxed);
    bytesReceived.fetch_add(wireBytes, std::memory_order_relaxed);
    touch();
  }
  /// The payload of a chunk copied out of the peer's memory (single copy): its arrival
  /// counted only the reference.
  void onSingleCopy(uint64_t bytes) noexcept {
    bytesReceived.fetch_add(bytes, std::memory_order_relaxed);
    singleCopyBytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  void addCreditWait(uint64_t ns) noexcept {
    creditWaitNs.fetch_add(ns, std::memory_order_relaxed);
  }
  void addEncodeTime(uint64_t ns) noexcept {
    encodeNs.fetch_add(ns, std::memory_order_relaxed);
  }
  void addBusyTime(uint64_t ns) noexcept {
    busyNs.fetch_add(ns, std::memory_order_relaxed);
  }
  /// One sampled lossy chunk of codecId (in [0, kMaxCodecs)) and its relative L2 error.
  void onErrorSample(int codecId, double relativeError) noexcept {
    const auto idx = static_cast<unsigned>(codecId);
    if (idx >= kMaxCodecs)
      return;
    errorSum[idx].fetch_add(relativeError, std::memory_order_relaxed);
    errorSamples[idx].fetch_add(1, std::memory_order_relaxed);
  }
  /// Marks progress now (e.g. a credit arrived).
  void touch() noexcept {
    lastProgressUnixNs.store(unixNowNsCoarse(), std::memory_order_relaxed);
  }
  void setGoodput(double bytesPerSecond) noexcept {
    goodputBytesPerSecond.store(bytesPerSecond, std::memory_order_relaxed);
  }
  void setChunkSize(uint64_t bytes) noexcept {
    chunkSizeBytes.store(bytes, std::memory_order_relaxed);
  }
  void setCodecRung(int codecId) noexcept {
    codecRung.store(codecId, std::memory_order_relaxed);
  }
};

static_assert(std::atomic<double>::is_always_lock_free, "goodput gauge must be lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be lock-free");

}  // namespace gs::monitoring
