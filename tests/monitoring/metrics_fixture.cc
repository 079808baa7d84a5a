// gs-metrics-fixture: a process that exports every gradstream metric family with plausible,
// moving values, for the deploy/ checks (promtool check metrics, dashboard names) and for a
// real Prometheus server to scrape without running collectives.
//
//   gs-metrics-fixture [--addr 127.0.0.1:0] [--local-rank N] [--rank N] [--seconds S]
// Prints "address host:port" on stdout once serving, then keeps updating counters for S
// seconds (default 30) and exits.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "monitoring/metrics.h"

using gs::monitoring::CollectiveOp;
using gs::monitoring::LinkCounters;

int main(int argc, char** argv) {
  std::string addr = "127.0.0.1:0";
  int localRank = 0;
  int rank = 0;
  double seconds = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--addr") == 0)
      addr = argv[i + 1];
    else if (std::strcmp(argv[i], "--local-rank") == 0)
      localRank = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--rank") == 0)
      rank = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--seconds") == 0)
      seconds = std::atof(argv[i + 1]);
  }
  try {
    gs::Config cfg;
    cfg.metricsAddress = addr;
    gs::monitoring::Metrics m(cfg, rank, 2, localRank, "tcp");
    m.setTransportInfo(
        {{"device", "lo"}, {"port", "0"}, {"gid_index", "-1"}, {"memory_path", "host"}});
    m.setCompressionError(2, 0.004);
    LinkCounters& link = m.addLink(1 - rank % 2);
    link.setChunkSize(1 << 20);
    std::printf("address %s\n", m.exporterAddress().c_str());
    std::fflush(stdout);
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    uint64_t i = 0;
    while (std::chrono::steady_clock::now() < end) {
      m.beginCollective();
      for (int c = 0; c < 16; ++c, ++i) {
        int codec = (i % 4 == 0) ? 2 : 0;  // mostly raw, some bf16
        uint64_t logical = 1 << 20;
        link.onChunkSent(logical, codec == 2 ? logical / 2 + 48 : logical + 48, codec);
        link.onChunkCompleted(200'000 + (i % 7) * 50'000);
        link.onChunkReceived(logical + 48);
      }
      link.addCreditWait(100'000);
      link.setGoodput(1.6e9);
      link.setCodecRung(i % 8 == 0 ? 2 : 0);
      m.recordCollective(CollectiveOp::kAllReduce, "ring", 0.01, 16u << 20, 1.6e9, 1.6e9);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    m.recordError(gs::Errc::kTimeout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gs-metrics-fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}
