// The HTTP exporter, fetched with a raw-socket GET as Prometheus would.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "gradstream/build_config.h"
#include "monitoring/metrics.h"
#include "tools/support/loopback_port.h"

namespace gs::monitoring {
namespace {

#if GS_HAVE_PROMETHEUS
#define REQUIRE_EXPORTER()
#else
#define REQUIRE_EXPORTER() GTEST_SKIP() << "built without prometheus-cpp (GS_WITH_PROMETHEUS)"
#endif

int portOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// GET http://127.0.0.1:<port><path>; returns the whole response (status line, headers, body).
std::string httpGet(int port, const std::string& path = "/metrics") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return "connect failed";
  }
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
    out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(Exporter, ServesMetricsWithValuesAndLabels) {
  REQUIRE_EXPORTER();
  Config cfg;
  cfg.metricsAddress = "127.0.0.1:0";
  Metrics m(cfg, 1, 2, 0, "tcp");
  std::string addr = m.exporterAddress();
  ASSERT_FALSE(addr.empty());
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  int port = portOf(addr);
  EXPECT_GT(port, 0);

  LinkCounters& l = m.addLink(0);
  l.onChunkSent(1 << 20, (1 << 19) + 48, 2);
  l.onChunkSent(1 << 20, (1 << 20) + 48, 0);
  l.onChunkReceived(12345);
  l.onChunkCompleted(150'000);
  l.setGoodput(1.25e9);
  l.setChunkSize(1 << 20);
  l.setCodecRung(2);
  l.addCreditWait(2'500'000'000);
  m.recordCollective(CollectiveOp::kAllReduce, "ring", 0.01, 1 << 21, 2.1e8, 2.1e8);
  m.recordError(Errc::kTimeout);
  m.setTransportInfo(
      {{"device", "lo"}, {"port", "0"}, {"gid_index", "-1"}, {"memory_path", "host"}});

  std::string resp = httpGet(port);
  ASSERT_TRUE(contains(resp, "200 OK")) << resp.substr(0, 200);
  const std::string c = "comm=\"" + m.commLabel() + "\"";
  // Labels are serialized in the order collect() gives them.
  const std::string base = "rank=\"1\"," + c + ",transport=\"tcp\"";
  EXPECT_TRUE(contains(resp, "# TYPE gs_bytes_wire_total counter")) << resp;
  EXPECT_TRUE(contains(resp, "gs_bytes_logical_total{" + base + ",peer=\"0\"} 2097152")) << resp;
  EXPECT_TRUE(contains(resp, "gs_bytes_wire_total{" + base + ",peer=\"0\"} 1572960")) << resp;
  EXPECT_TRUE(contains(resp, "gs_chunks_total{" + base + ",peer=\"0\",codec=\"raw\"} 1"));
  EXPECT_TRUE(contains(resp, "gs_chunks_total{" + base + ",peer=\"0\",codec=\"bf16\"} 1"));
  EXPECT_TRUE(contains(resp, "gs_bytes_received_total{" + base + ",peer=\"0\"} 12345"));
  EXPECT_TRUE(
      contains(resp, "gs_link_goodput_bytes_per_second{" + base + ",peer=\"0\"} 1250000000"));
  EXPECT_TRUE(contains(resp, "gs_chunk_size_bytes{" + base + ",peer=\"0\"} 1048576"));
  EXPECT_TRUE(contains(resp, "gs_codec_rung{" + base + ",peer=\"0\"} 2"));
  EXPECT_TRUE(contains(resp, "gs_credit_wait_seconds_total{" + base + ",peer=\"0\"} 2.5"));
  EXPECT_TRUE(contains(resp, "# TYPE gs_chunk_latency_seconds histogram"));
  EXPECT_TRUE(contains(resp, "gs_chunk_latency_seconds_count{" + base + ",peer=\"0\"} 1"));
  EXPECT_TRUE(contains(
      resp, "gs_chunk_latency_seconds_bucket{" + base + ",peer=\"0\",le=\"0.000316228\"} 1"))
      << resp;
  EXPECT_TRUE(
      contains(resp, "gs_chunk_latency_seconds_bucket{" + base + ",peer=\"0\",le=\"0.0001\"} 0"));
  EXPECT_TRUE(
      contains(resp, "gs_collective_seconds_count{" + base + ",op=\"allreduce\",algo=\"ring\"} 1"));
  EXPECT_TRUE(contains(
      resp, "gs_collective_busbw_bytes_per_second{" + base + ",op=\"allreduce\"} 210000000"));
  EXPECT_TRUE(contains(resp, "gs_errors_total{" + base + ",kind=\"timeout\"} 1"));
  EXPECT_TRUE(contains(resp, "gs_last_progress_timestamp_seconds{" + base + ",peer=\"0\"} 1"));
  EXPECT_TRUE(contains(resp, "gs_transport_info{" + base +
                                 ",device=\"lo\",gid_index=\"-1\",memory_path=\"host\","
                                 "port=\"0\"} 1"))
      << resp;

  // Counters move between scrapes.
  l.onChunkSent(100, 100, 0);
  std::string resp2 = httpGet(port);
  EXPECT_TRUE(contains(resp2, "gs_chunks_total{" + base + ",peer=\"0\",codec=\"raw\"} 2"));
}

TEST(Exporter, LocalRanksGetDifferentPorts) {
  REQUIRE_EXPORTER();
  // Two consecutive free ports outside the ephemeral range (see freeLoopbackPortRun: the old
  // probe's ephemeral port had a neighbour another process's connection could take).
  const int base = support::freeLoopbackPortRun(2);
  ASSERT_GT(base, 0) << "no two consecutive free loopback ports";
  Config cfg;
  cfg.metricsAddress = "127.0.0.1:" + std::to_string(base);
  Metrics r0(cfg, 0, 2, 0, "tcp");
  Metrics r1(cfg, 1, 2, 1, "tcp");
  EXPECT_EQ(portOf(r0.exporterAddress()), base);
  EXPECT_EQ(portOf(r1.exporterAddress()), base + 1);
  r0.addLink(1).onChunkSent(7, 7, 0);
  r1.addLink(0).onChunkSent(9, 9, 0);
  std::string s0 = httpGet(base);
  std::string s1 = httpGet(base + 1);
  EXPECT_TRUE(contains(s0, "gs_bytes_wire_total{rank=\"0\"")) << s0;
  EXPECT_FALSE(contains(s0, "rank=\"1\""));
  EXPECT_TRUE(contains(s1, "gs_bytes_wire_total{rank=\"1\"")) << s1;
}

TEST(Exporter, EphemeralPortsDiffer) {
  REQUIRE_EXPORTER();
  Config cfg;
  cfg.metricsAddress = "127.0.0.1:0";
  Metrics a(cfg, 0, 2, 0, "tcp");
  Metrics b(cfg, 1, 2, 1, "tcp");
  EXPECT_NE(a.exporterAddress(), b.exporterAddress());
}

TEST(Exporter, CommunicatorsOfOneProcessShareAnAddress) {
  REQUIRE_EXPORTER();
  const int port = support::freeLoopbackPortRun(1);  // not ephemeral: see the test above
  ASSERT_GT(port, 0);
  Config cfg;
  cfg.metricsAddress = "127.0.0.1:" + std::to_string(port);
  Metrics a(cfg, 0, 2, 0, "tcp");
  std::string bodyA;
  {
    Metrics b(cfg, 0, 4, 0, "tcp");  // a second process group on the same rank
    EXPECT_EQ(a.exporterAddress(), b.exporterAddress());
    a.addLink(1);
    b.addLink(3);
    bodyA = httpGet(port);
    EXPECT_TRUE(contains(bodyA, "comm=\"" + a.commLabel() + "\",transport=\"tcp\",peer=\"1\""));
    EXPECT_TRUE(contains(bodyA, "comm=\"" + b.commLabel() + "\",transport=\"tcp\",peer=\"3\""));
    // One TYPE line per family even with two sources.
    size_t first = bodyA.find("# TYPE gs_bytes_wire_total");
    EXPECT_EQ(bodyA.find("# TYPE gs_bytes_wire_total", first + 1), std::string::npos);
  }
  std::string after = httpGet(port);  // b is gone, a still served
  EXPECT_TRUE(contains(after, "comm=\"" + a.commLabel() + "\""));
  EXPECT_FALSE(contains(after, "peer=\"3\""));
}

TEST(Exporter, BusyPortIsASystemErrorNamingTheAddress) {
  REQUIRE_EXPORTER();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  int port = ntohs(sa.sin_port);
  Config cfg;
  cfg.metricsAddress = "127.0.0.1:" + std::to_string(port);
  try {
    Metrics m(cfg, 0, 2, 0, "tcp");
    ADD_FAILURE() << "bound a busy port " << port;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kSystem);
    EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(port))) << e.what();
  }
  close(fd);
}

TEST(Exporter, UnassignedAddressIsASystemError) {
  REQUIRE_EXPORTER();
  Config cfg;
  cfg.metricsAddress = "192.0.2.1:9400";  // TEST-NET-1: not an address of this host
  try {
    Metrics m(cfg, 0, 2, 0, "tcp");
    ADD_FAILURE() << "bound " << cfg.metricsAddress;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kSystem);
    EXPECT_TRUE(contains(e.what(), "192.0.2.1:9400")) << e.what();
  }
}

TEST(Exporter, OtherPathsAreNotFound) {
  REQUIRE_EXPORTER();
  Config cfg;
  cfg.metricsAddress = "127.0.0.1:0";
  Metrics m(cfg, 0, 2, 0, "tcp");
  std::string resp = httpGet(portOf(m.exporterAddress()), "/nothing");
  EXPECT_FALSE(contains(resp, "200 OK")) << resp.substr(0, 200);
}

}  // namespace
}  // namespace gs::monitoring
