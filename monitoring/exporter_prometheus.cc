// The Prometheus exporter: one prometheus::Exposer (civetweb) per bound address, with one
// Collectable that asks every registered communicator for its families at scrape time and
// merges families of the same name, so several communicators of a process share /metrics.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include "common/error.h"
#include "monitoring/exporter.h"

namespace gs::monitoring::detail {

namespace {

prometheus::MetricType toPrometheus(Family::Type t) {
  switch (t) {
    case Family::Type::kCounter:
      return prometheus::MetricType::Counter;
    case Family::Type::kGauge:
      return prometheus::MetricType::Gauge;
    case Family::Type::kHistogram:
      return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

prometheus::ClientMetric toPrometheus(const Sample& s, Family::Type t) {
  prometheus::ClientMetric m;
  for (const auto& [k, v] : s.labels)
    m.label.push_back({k, v});
  switch (t) {
    case Family::Type::kCounter:
      m.counter.value = s.value;
      break;
    case Family::Type::kGauge:
      m.gauge.value = s.value;
      break;
    case Family::Type::kHistogram:
      m.histogram.sample_count = s.count;
      m.histogram.sample_sum = s.sum;
      for (size_t i = 0; i < s.bounds.size(); ++i)
        m.histogram.bucket.push_back({s.cumulative[i], s.bounds[i]});
      break;
  }
  return m;
}

class Sources : public prometheus::Collectable {
 public:
  uint64_t add(CollectFn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t h = ++next_;
    fns_.emplace(h, std::make_shared<CollectFn>(std::move(fn)));
    return h;
  }
  void remove(uint64_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    fns_.erase(h);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<std::shared_ptr<CollectFn>> fns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [h, fn] : fns_)
        fns.push_back(fn);
    }
    std::vector<prometheus::MetricFamily> out;
    std::map<std::string, size_t> index;
    for (const auto& fn : fns) {
      for (const Family& f : (*fn)()) {
        auto [it, fresh] = index.emplace(f.name, out.size());
        if (fresh) {
          prometheus::MetricFamily pf;
          pf.name = f.name;
          pf.help = f.help;
          pf.type = toPrometheus(f.type);
          out.push_back(std::move(pf));
        }
        auto& dst = out[it->second].metric;
        for (const Sample& s : f.samples)
          dst.push_back(toPrometheus(s, f.type));
      }
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  uint64_t next_ = 0;
  // Held by shared_ptr so a scrape in flight keeps a removed source (and the State it
  // captured) alive until it ends.
  std::map<uint64_t, std::shared_ptr<CollectFn>> fns_;
};

class PrometheusExporter : public Exporter {
 public:
  explicit PrometheusExporter(const MetricsAddress& addr) : host_(addr.host) {
    std::string bind = addr.bindString();
    try {
      // Two civetweb threads: one slow client cannot block a scrape.
      exposer_ = std::make_unique<prometheus::Exposer>(bind, 2);
    } catch (const std::exception& e) {
      throwError(Errc::kSystem, __FILE__, __LINE__,
                 formatString("cannot serve metrics on %s (GS_METRICS_ADDR, port offset by the "
                              "local rank): %s",
                              bind.c_str(), e.what()));
    }
    auto ports = exposer_->GetListeningPorts();
    port_ = ports.empty() ? addr.port : ports.front();
    sources_ = std::make_shared<Sources>();
    exposer_->RegisterCollectable(sources_);
  }
  ~PrometheusExporter() override {
    exposer_->RemoveCollectable(sources_);
    // civetweb's listener polls with a 2 s quantum and checks its stop flag only between
    // polls, so a plain stop takes up to 2 s (gs_comm_destroy would stall that long). A few
    // loopback connections wake the poll once the stop flag is set.
    std::atomic<bool> stopped{false};
    std::thread waker([this, &stopped] {
      for (int i = 0; i < 300 && !stopped.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        poke();
      }
    });
    exposer_.reset();  // stops the server threads before sources_ goes
    stopped = true;
    waker.join();
  }

  std::string address() const override {
    MetricsAddress a;
    a.host = host_;
    a.port = port_;
    return a.bindString();
  }
  uint64_t add(CollectFn fn) override { return sources_->add(std::move(fn)); }
  void remove(uint64_t handle) override { sources_->remove(handle); }

 private:
  // Connects to the listener and closes at once (best effort, never throws).
  void poke() const noexcept {
    bool v6 = host_.find(':') != std::string::npos;
    sockaddr_storage ss{};
    socklen_t len;
    if (v6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(static_cast<uint16_t>(port_));
      if (host_ == "::" || inet_pton(AF_INET6, host_.c_str(), &a->sin6_addr) != 1)
        a->sin6_addr = in6addr_loopback;
      len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_port = htons(static_cast<uint16_t>(port_));
      if (host_ == "0.0.0.0" || inet_pton(AF_INET, host_.c_str(), &a->sin_addr) != 1)
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(*a);
    }
    int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      return;
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&ss), len);
    ::close(fd);
  }

  std::string host_;
  int port_ = 0;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<Sources> sources_;
};

std::mutex gRegistryMu;
std::map<std::string, std::weak_ptr<PrometheusExporter>>& registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<PrometheusExporter>>;
  return *r;
}

}  // namespace

bool exporterAvailable() noexcept {
  return true;
}

std::shared_ptr<Exporter> acquireExporter(const MetricsAddress& addr) {
  if (addr.port == 0)
    return std::make_shared<PrometheusExporter>(addr);  // ephemeral: always a server of its own
  std::lock_guard<std::mutex> lock(gRegistryMu);
  auto& slot = registry()[addr.bindString()];
  if (auto existing = slot.lock())
    return existing;
  auto fresh = std::make_shared<PrometheusExporter>(addr);
  slot = fresh;
  return fresh;
}

}  // namespace gs::monitoring::detail
