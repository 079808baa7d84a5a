#include "monitoring/metrics.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace gs::monitoring {
namespace {

const Family* findFamily(const std::vector<Family>& fams, const std::string& name) {
  for (const auto& f : fams) {
    if (f.name == name)
      return &f;
  }
  return nullptr;
}

std::string label(const Sample& s, const std::string& key) {
  for (const auto& [k, v] : s.labels) {
    if (k == key)
      return v;
  }
  return "<none>";
}

// The sample of `name` whose labels include every pair in `want`.
const Sample* findSample(const std::vector<Family>& fams,
                         const std::string& name,
                         std::vector<std::pair<std::string, std::string>> want) {
  const Family* f = findFamily(fams, name);
  if (f == nullptr)
    return nullptr;
  for (const auto& s : f->samples) {
    bool ok = true;
    for (const auto& [k, v] : want)
      ok = ok && label(s, k) == v;
    if (ok)
      return &s;
  }
  return nullptr;
}

TEST(Metrics, NoAddressMeansNoExporter) {
  Config cfg;
  Metrics m(cfg, 0, 2, 0, "tcp");
  EXPECT_EQ(m.exporterAddress(), "");
  EXPECT_EQ(m.rank(), 0);
}

TEST(Metrics, AddLinkIsIdempotentWithStableAddresses) {
  Config cfg;
  Metrics m(cfg, 1, 4, 0, "loopback");
  LinkCounters& a = m.addLink(0);
  LinkCounters& b = m.addLink(2);
  for (int p = 3; p < 40; ++p)
    m.addLink(p);  // growth must not move earlier links
  EXPECT_EQ(&m.addLink(0), &a);
  EXPECT_EQ(m.link(2), &b);
  EXPECT_EQ(m.link(1), nullptr);
}

TEST(Metrics, SnapshotTotalsAndPerLinkFigures) {
  Config cfg;
  Metrics m(cfg, 0, 3, 0, "tcp");
  LinkCounters& l1 = m.addLink(1);
  LinkCounters& l2 = m.addLink(2);
  l1.onChunkSent(1000, 500, 2);
  l1.onChunkSent(1000, 500, 2);
  l2.onChunkSent(1000, 1000, 0);
  l1.onChunkReceived(700);
  l2.addCreditWait(1234);
  l1.setGoodput(2e9);
  l2.setChunkSize(65536);
  l2.setCodecRung(5);
  l1.onChunkCompleted(20'000);  // bucket 1 (<= 31.6us)
  l1.onChunkCompleted(20'000);
  l1.onChunkCompleted(2'000'000);  // bucket 5 (<= 3.16ms)

  Snapshot s = m.snapshot();
  EXPECT_EQ(s.rank, 0);
  EXPECT_EQ(s.nranks, 3);
  EXPECT_EQ(s.bytesLogical, 3000u);
  EXPECT_EQ(s.bytesWire, 2000u);
  EXPECT_DOUBLE_EQ(s.compressionRatio(), 1.5);
  EXPECT_EQ(s.chunksSent, 3u);
  EXPECT_EQ(s.chunksReceived, 1u);
  EXPECT_EQ(s.bytesReceived, 700u);
  EXPECT_EQ(s.creditWaitNs, 1234u);
  EXPECT_EQ(s.chunksByCodec[0], 1u);
  EXPECT_EQ(s.chunksByCodec[2], 2u);
  ASSERT_EQ(s.links.size(), 2u);
  const LinkSnapshot* a = s.link(1);
  ASSERT_NE(a, nullptr);
  EXPECT_DOUBLE_EQ(a->compressionRatio(), 2.0);
  EXPECT_DOUBLE_EQ(a->goodputBytesPerSecond, 2e9);
  EXPECT_EQ(a->latencyCount(), 3u);
  EXPECT_EQ(a->latencySumNs, 2'040'000u);
  EXPECT_NEAR(a->latencyQuantileSeconds(0.5), 31.623e-6, 1e-9);
  EXPECT_NEAR(a->latencyQuantileSeconds(1.0), 3.162278e-3, 1e-9);
  const LinkSnapshot* b = s.link(2);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->chunkSizeBytes, 65536u);
  EXPECT_EQ(b->codecRung, 5);
  EXPECT_EQ(b->latencyQuantileSeconds(0.5), 0.0);
  EXPECT_EQ(s.link(7), nullptr);
}

TEST(Metrics, CollectivesByOpAndAlgo) {
  Config cfg;
  Metrics m(cfg, 0, 2, 0, "tcp");
  m.beginCollective();
  EXPECT_TRUE(m.snapshot().collectiveInProgress);
  m.recordCollective(CollectiveOp::kAllReduce, "ring", 0.002, 1 << 20, 5e8, 5e8);
  EXPECT_FALSE(m.snapshot().collectiveInProgress);
  m.recordCollective(CollectiveOp::kAllReduce, "exchange", 20e-6, 64, 3.2e6, 3.2e6);
  m.recordCollective(CollectiveOp::kAllReduce, "ring", 0.004, 1 << 20, 2.5e8, 2.5e8);
  m.recordCollective(CollectiveOp::kBroadcast, "chain", 0.5, 100, 200, 200);

  Snapshot s = m.snapshot();
  EXPECT_EQ(s.collectives, 4u);
  const OpSnapshot& ar = s.ops[static_cast<int>(CollectiveOp::kAllReduce)];
  EXPECT_EQ(ar.count, 3u);
  EXPECT_EQ(ar.bytes, (2u << 20) + 64u);
  EXPECT_NEAR(ar.secondsTotal, 0.00602, 1e-9);
  EXPECT_DOUBLE_EQ(ar.lastAlgbw, 2.5e8);  // the last one wins
  EXPECT_EQ(s.ops[static_cast<int>(CollectiveOp::kBroadcast)].count, 1u);
  EXPECT_EQ(s.ops[static_cast<int>(CollectiveOp::kAllGather)].count, 0u);

  auto fams = m.collect();
  const Sample* ring =
      findSample(fams, "gs_collective_seconds", {{"op", "allreduce"}, {"algo", "ring"}});
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(ring->count, 2u);
  EXPECT_NEAR(ring->sum, 0.006, 1e-12);
  ASSERT_EQ(ring->bounds.size(), kCollectiveBoundsNs.size() + 1);
  EXPECT_TRUE(std::isinf(ring->bounds.back()));
  EXPECT_EQ(ring->cumulative.back(), 2u);
  // 2 ms and 4 ms: none <= 1 ms, one <= 3.16 ms, both <= 10 ms.
  EXPECT_EQ(ring->cumulative[4], 0u);
  EXPECT_EQ(ring->cumulative[5], 1u);
  EXPECT_EQ(ring->cumulative[6], 2u);
  EXPECT_EQ(findSample(fams, "gs_collective_seconds", {{"op", "allgather"}}), nullptr);
  const Sample* bw =
      findSample(fams, "gs_collective_busbw_bytes_per_second", {{"op", "broadcast"}});
  ASSERT_NE(bw, nullptr);
  EXPECT_DOUBLE_EQ(bw->value, 200);
}

TEST(Metrics, AlgoNamesBeyondTheSlotsCountAsOther) {
  Config cfg;
  Metrics m(cfg, 0, 2, 0, "tcp");
  for (int i = 0; i < 12; ++i) {
    std::string algo = "algo" + std::to_string(i);
    m.recordCollective(CollectiveOp::kAllGather, algo.c_str(), 0.001, 1, 1, 1);
  }
  m.recordCollective(CollectiveOp::kAllGather, nullptr, 0.001, 1, 1, 1);  // "other" too: full
  auto fams = m.collect();
  const Sample* other =
      findSample(fams, "gs_collective_seconds", {{"op", "allgather"}, {"algo", "other"}});
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->count, 5u);
  EXPECT_EQ(m.snapshot().ops[static_cast<int>(CollectiveOp::kAllGather)].count, 13u);
}

TEST(Metrics, ErrorsByKind) {
  Config cfg;
  Metrics m(cfg, 0, 2, 0, "tcp");
  m.beginCollective();
  m.recordError(Errc::kTimeout);
  m.recordError(Errc::kTimeout);
  m.recordError(Errc::kRemote);
  m.recordError(Errc::kOk);  // ignored
  Snapshot s = m.snapshot();
  EXPECT_FALSE(s.collectiveInProgress);
  EXPECT_EQ(s.errorsTotal, 3u);
  EXPECT_EQ(s.errors[-static_cast<int>(Errc::kTimeout) - 1], 2u);
  auto fams = m.collect();
  const Family* f = findFamily(fams, "gs_errors_total");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->samples.size(), static_cast<size_t>(kErrorKinds));  // zeros exported too
  EXPECT_EQ(findSample(fams, "gs_errors_total", {{"kind", "timeout"}})->value, 2);
  EXPECT_EQ(findSample(fams, "gs_errors_total", {{"kind", "aborted"}})->value, 0);
}

TEST(Metrics, DeviceBufferStagingByPathAndDirection) {
  Config cfg;
  Metrics m(cfg, 0, 2, 0, "tcp");
  auto fams = m.collect();
  // Exported at zero before any device-buffer collective (dashboards and alerts see the series).
  EXPECT_EQ(
      findSample(fams, "gs_device_collectives_total", {{"path", "pinned_host_staging"}})->value, 0);
  m.recordStaged(1000, 3000);
  m.recordStaged(24, 0);
  fams = m.collect();
  EXPECT_EQ(
      findSample(fams, "gs_device_collectives_total", {{"path", "pinned_host_staging"}})->value, 2);
  EXPECT_EQ(
      findSample(fams, "gs_device_staged_bytes_total", {{"direction", "device_to_host"}})->value,
      1024);
  EXPECT_EQ(
      findSample(fams, "gs_device_staged_bytes_total", {{"direction", "host_to_device"}})->value,
      3000);
  const Snapshot snap = m.snapshot();
  EXPECT_EQ(snap.stagedCollectives, 2u);
  EXPECT_EQ(snap.stagedToHostBytes, 1024u);
  EXPECT_EQ(snap.stagedToDeviceBytes, 3000u);
}

// Links served by shared memory next to tcp ones: each link's series name its own transport,
// the communicator's series the combination.
TEST(Metrics, LinkSeriesCarryTheirOwnTransport) {
  Config cfg;
  Metrics m(cfg, 0, 4, 0, "shm+tcp");
  m.addLink(1, "shm");
  m.addLink(2, "tcp");
  m.addLink(3);  // the communicator's
  EXPECT_EQ(&m.addLink(1, "tcp"), m.link(1)) << "idempotent, first transport kept";
  auto fams = m.collect();
  for (const char* name : {"gs_bytes_wire_total", "gs_chunk_latency_seconds", "gs_chunks_total",
                           "gs_last_progress_timestamp_seconds"}) {
    EXPECT_EQ(label(*findSample(fams, name, {{"peer", "1"}}), "transport"), "shm") << name;
    EXPECT_EQ(label(*findSample(fams, name, {{"peer", "2"}}), "transport"), "tcp") << name;
    EXPECT_EQ(label(*findSample(fams, name, {{"peer", "3"}}), "transport"), "shm+tcp") << name;
  }
  EXPECT_EQ(label(*findSample(fams, "gs_communicator_ranks", {}), "transport"), "shm+tcp");
  const Snapshot snap = m.snapshot();
  ASSERT_EQ(snap.links.size(), 3u);
  EXPECT_EQ(snap.link(1)->transport, "shm");
  EXPECT_EQ(snap.link(2)->transport, "tcp");
  EXPECT_EQ(snap.link(3)->transport, "shm+tcp");
}

TEST(Metrics, CollectHasEveryFamilyWithConstantLabels) {
  Config cfg;
  Metrics m(cfg, 5, 8, 1, "tcp");
  LinkCounters& l = m.addLink(4);
  l.onChunkSent(4096, 1024 + 32, 6);
  l.onChunkCompleted(50'000);
  l.setGoodput(1e9);
  m.setTransportInfo({{"device", "mlx5_0"},
                      {"port", "1"},
                      {"gid-index", "3"},
                      {"memory_path", "dmabuf"},
                      {"rank", "x"}});
  m.setCompressionError(6, 0.02);
  auto fams = m.collect();
  for (const char* name : {"gs_bytes_logical_total",
                           "gs_bytes_wire_total",
                           "gs_chunks_total",
                           "gs_chunks_received_total",
                           "gs_bytes_received_total",
                           "gs_single_copy_bytes_total",
                           "gs_link_goodput_bytes_per_second",
                           "gs_chunk_latency_seconds",
                           "gs_chunk_size_bytes",
                           "gs_codec_rung",
                           "gs_credit_wait_seconds_total",
                           "gs_last_progress_timestamp_seconds",
                           "gs_collective_algbw_bytes_per_second",
                           "gs_collective_busbw_bytes_per_second",
                           "gs_collective_in_progress",
                           "gs_errors_total",
                           "gs_compression_error",
                           "gs_transport_info",
                           "gs_communicator_ranks",
                           "gs_device_collectives_total",
                           "gs_device_staged_bytes_total"}) {
    const Family* f = findFamily(fams, name);
    ASSERT_NE(f, nullptr) << name;
    for (const auto& s : f->samples) {
      EXPECT_EQ(label(s, "rank"), "5") << name;
      EXPECT_EQ(label(s, "comm"), m.commLabel()) << name;
      EXPECT_EQ(label(s, "transport"), "tcp") << name;
    }
  }
  EXPECT_EQ(findSample(fams, "gs_chunks_total", {{"peer", "4"}, {"codec", "int4"}})->value, 1);
  EXPECT_EQ(findSample(fams, "gs_chunks_total", {{"peer", "4"}, {"codec", "raw"}})->value, 0);
  EXPECT_EQ(findSample(fams, "gs_bytes_wire_total", {{"peer", "4"}})->value, 1056);
  EXPECT_EQ(findSample(fams, "gs_compression_error", {{"codec", "int4"}})->value, 0.02);
  EXPECT_EQ(findFamily(fams, "gs_compression_error")->samples.size(), 1u);
  const Sample* info = findSample(fams, "gs_transport_info", {});
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(label(*info, "device"), "mlx5_0");
  EXPECT_EQ(label(*info, "gid_index"), "3");  // sanitized label name
  EXPECT_EQ(label(*info, "info_rank"), "x");  // cannot shadow the constant label
  EXPECT_EQ(label(*info, "rank"), "5");
  const Sample* lat = findSample(fams, "gs_chunk_latency_seconds", {{"peer", "4"}});
  ASSERT_NE(lat, nullptr);
  EXPECT_EQ(lat->count, 1u);
  EXPECT_NEAR(lat->sum, 50e-6, 1e-12);
  const Sample* prog = findSample(fams, "gs_last_progress_timestamp_seconds", {{"peer", "4"}});
  EXPECT_GT(prog->value, 1.5e9);
}

TEST(Metrics, CommunicatorsGetDistinctCommLabels) {
  Config cfg;
  Metrics a(cfg, 0, 2, 0, "tcp");
  Metrics b(cfg, 0, 2, 0, "tcp");
  EXPECT_NE(a.commLabel(), b.commLabel());
}

TEST(Metrics, ConcurrentWritersAndReaders) {
  Config cfg;
  Metrics m(cfg, 0, 2, 0, "loopback");
  LinkCounters& l = m.addLink(1);
  constexpr int kIters = 100000;
  std::vector<std::thread> writers;
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < kIters; ++i) {
        l.onChunkSent(8, 4, i % kMaxCodecs);
        l.onChunkCompleted(static_cast<uint64_t>(i) * 10);
        if (i % 1000 == 0)
          m.recordCollective(CollectiveOp::kAllReduce, i % 2000 ? "ring" : "tree", 1e-3, 8, 1, 1);
      }
    });
  }
  uint64_t last = 0;
  for (int i = 0; i < 200; ++i) {
    Snapshot s = m.snapshot();
    EXPECT_GE(s.chunksSent, last);
    last = s.chunksSent;
    (void)m.collect();
  }
  for (auto& w : writers)
    w.join();
  Snapshot s = m.snapshot();
  EXPECT_EQ(s.chunksSent, 2u * kIters);
  EXPECT_EQ(s.bytesLogical, 16u * kIters);
  EXPECT_EQ(s.links[0].latencyCount(), 2u * kIters);
  EXPECT_EQ(s.collectives, 200u);
}

TEST(MetricsAddress, Parses) {
  auto a = parseMetricsAddress("127.0.0.1:9400", 0);
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 9400);
  EXPECT_EQ(a.bindString(), "127.0.0.1:9400");
  EXPECT_EQ(parseMetricsAddress("127.0.0.1:9400", 3).port, 9403);
  EXPECT_EQ(parseMetricsAddress("127.0.0.1:0", 3).port, 0);  // ephemeral stays ephemeral
  auto b = parseMetricsAddress("9500", 1);
  EXPECT_EQ(b.host, "127.0.0.1");
  EXPECT_EQ(b.port, 9501);
  auto c = parseMetricsAddress("[::1]:9400", 2);
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.bindString(), "[::1]:9402");
  EXPECT_EQ(parseMetricsAddress("0.0.0.0:1", 0).host, "0.0.0.0");
}

TEST(MetricsAddress, RejectsMalformedWithClearErrors) {
  for (const char* bad : {"", "localhost:9400", "127.0.0.1:", "127.0.0.1:abc", "127.0.0.1:70000",
                          "::1:9400", "[::1]9400", "[::1", ":9400", "1.2.3:80", "127.0.0.1:-5"}) {
    try {
      parseMetricsAddress(bad, 0);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("GS_METRICS_ADDR"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  try {
    parseMetricsAddress("127.0.0.1:65535", 2);
    ADD_FAILURE() << "port overflow accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("local rank 2"), std::string::npos) << e.what();
  }
}

TEST(Metrics, MalformedAddressFailsConstruction) {
  Config cfg;
  cfg.metricsAddress = "not-an-address:x";
  try {
    Metrics m(cfg, 0, 2, 0, "tcp");
    ADD_FAILURE() << "constructed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("not-an-address:x"), std::string::npos);
  }
}

}  // namespace
}  // namespace gs::monitoring
