// Builds the metric families of one communicator from its atomics (scrape time only).

#include <cmath>
#include <limits>
#include <string>

#include "monitoring/metrics_state.h"

namespace gs::monitoring {

namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

template <size_t N, size_t B>
Sample histogramSample(Labels labels,
                       const DurationHistogram<N>& h,
                       const std::array<uint64_t, B>& boundsNs) {
  static_assert(B == N);
  Sample s;
  s.labels = std::move(labels);
  uint64_t cum = 0;
  for (size_t i = 0; i < DurationHistogram<N>::kBuckets; ++i) {
    cum += h.counts[i].load(std::memory_order_relaxed);
    s.bounds.push_back(i < N ? static_cast<double>(boundsNs[i]) * 1e-9
                             : std::numeric_limits<double>::infinity());
    s.cumulative.push_back(cum);
  }
  s.count = cum;
  s.sum = static_cast<double>(h.sumNs.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

Sample valueSample(Labels labels, double v) {
  Sample s;
  s.labels = std::move(labels);
  s.value = v;
  return s;
}

Family family(const char* name, const char* help, Family::Type type) {
  Family f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

}  // namespace

std::vector<Family> Metrics::State::collect() const {
  constexpr auto r = std::memory_order_relaxed;
  using T = Family::Type;
  const Labels base = {{"rank", std::to_string(rank)}, {"comm", comm}, {"transport", transport}};
  auto with = [&](std::initializer_list<std::pair<std::string, std::string>> extra) {
    Labels l = base;
    l.insert(l.end(), extra.begin(), extra.end());
    return l;
  };

  // One family per exported row of monitoring/link_counters.inc, in its order.
  std::vector<Family> linkFamilies;
#define GS_LINK_COUNTER(type, field, metric, kind, scale, help) \
  linkFamilies.push_back(family(metric, help, T::kind));
#define GS_LINK_CODEC_COUNTERS(type, field, metric, kind, help) \
  GS_LINK_COUNTER(type, field, metric, kind, 1.0, help)
#define GS_LINK_HISTOGRAM(field, metric, help) \
  GS_LINK_COUNTER(, field, metric, kHistogram, 1.0, help)
#include "monitoring/link_counters.inc"
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < links.size(); ++i) {
      const auto& lc = links[i];
      const std::string peer = std::to_string(lc->peer);
      // Link series: the transport label names what carries this link (shm next to tcp).
      Labels linkBase = base;
      linkBase[2].second = linkTransports[i];  // base is {rank, comm, transport}
      auto linkWith = [&](std::initializer_list<std::pair<std::string, std::string>> extra) {
        Labels l = linkBase;
        l.insert(l.end(), extra.begin(), extra.end());
        return l;
      };
      Labels pl = linkWith({{"peer", peer}});
      Family* f = linkFamilies.data();
#define GS_LINK_COUNTER(type, field, metric, kind, scale, help) \
  (f++)->samples.push_back(valueSample(pl, static_cast<double>(lc->field.load(r)) * (scale)));
#define GS_LINK_CODEC_COUNTERS(type, field, metric, kind, help)                             \
  for (int c = 0; c < kMaxCodecs; ++c) {                                                    \
    f->samples.push_back(valueSample(linkWith({{"peer", peer}, {"codec", kCodecNames[c]}}), \
                                     static_cast<double>(lc->field[c].load(r))));           \
  }                                                                                         \
  ++f;
#define GS_LINK_HISTOGRAM(field, metric, help) \
  (f++)->samples.push_back(histogramSample(pl, lc->field, kChunkLatencyBoundsNs));
#include "monitoring/link_counters.inc"
    }
  }

  Family collSeconds = family("gs_collective_seconds",
                              "Duration of collectives by kind and algorithm", T::kHistogram);
  Family collBytes = family("gs_collective_bytes_total",
                            "Bytes of the user's buffers processed by collectives", T::kCounter);
  Family algbw =
      family("gs_collective_algbw_bytes_per_second",
             "Algorithm bandwidth (size / time) of the last collective of a kind", T::kGauge);
  Family busbw =
      family("gs_collective_busbw_bytes_per_second",
             "Bus bandwidth (nccl-tests convention) of the last collective of a kind", T::kGauge);
  for (int o = 0; o < kCollectiveOps; ++o) {
    const OpState& op = ops[o];
    const char* opName = collectiveOpName(static_cast<CollectiveOp>(o));
    for (const AlgoSlot& slot : op.algos) {
      if (slot.state.load(std::memory_order_acquire) != 2)
        continue;
      uint64_t n = 0;
      for (const auto& c : slot.duration.counts)
        n += c.load(r);
      if (n == 0)
        continue;  // keep unused (op, algo) pairs out of the scrape
      Labels l = with({{"op", opName}, {"algo", slot.name}});
      collSeconds.samples.push_back(histogramSample(l, slot.duration, kCollectiveBoundsNs));
      collBytes.samples.push_back(valueSample(l, static_cast<double>(slot.bytes.load(r))));
    }
    algbw.samples.push_back(valueSample(with({{"op", opName}}), op.lastAlgbw.load(r)));
    busbw.samples.push_back(valueSample(with({{"op", opName}}), op.lastBusbw.load(r)));
  }

  Family inProg = family("gs_collective_in_progress",
                         "1 while a collective runs on this communicator, else 0", T::kGauge);
  inProg.samples.push_back(valueSample(base, inProgress.load(r)));

  Family errs = family("gs_errors_total", "Failed operations by kind", T::kCounter);
  for (int e = 0; e < kErrorKinds; ++e) {
    errs.samples.push_back(valueSample(with({{"kind", errorKindName(static_cast<Errc>(-e - 1))}}),
                                       static_cast<double>(errors[e].load(r))));
  }

  // The path label names how device buffers reach the transport: only pinned host staging in
  // this version (GPUDirect would be a second path).
  Family devColl = family("gs_device_collectives_total",
                          "Collectives on CUDA device buffers by data path", T::kCounter);
  devColl.samples.push_back(valueSample(with({{"path", "pinned_host_staging"}}),
                                        static_cast<double>(stagedCollectives.load(r))));
  Family staged =
      family("gs_device_staged_bytes_total",
             "Bytes copied between device buffers and pinned host staging", T::kCounter);
  staged.samples.push_back(valueSample(with({{"direction", "device_to_host"}}),
                                       static_cast<double>(stagedToHostBytes.load(r))));
  staged.samples.push_back(valueSample(with({{"direction", "host_to_device"}}),
                                       static_cast<double>(stagedToDeviceBytes.load(r))));

  Family regs =
      family("gs_buffer_registrations_total",
             "Registrations of the caller's buffers with a transport device", T::kCounter);
  regs.samples.push_back(valueSample(base, static_cast<double>(bufferRegistrations.load(r))));
  Family regBytes =
      family("gs_buffer_registered_bytes_total",
             "Bytes of the caller's buffers registered with a transport device", T::kCounter);
  regBytes.samples.push_back(valueSample(base, static_cast<double>(bufferRegisteredBytes.load(r))));

  Family compErr =
      family("gs_compression_error", "Sampled relative error of lossy chunks by codec", T::kGauge);
  for (int c = 0; c < kMaxCodecs; ++c) {
    double v = compressionError[c].load(r);
    if (!std::isnan(v))
      compErr.samples.push_back(valueSample(with({{"codec", kCodecNames[c]}}), v));
  }

  Family infoFam =
      family("gs_transport_info", "Transport details of a communicator (value 1)", T::kGauge);
  {
    std::lock_guard<std::mutex> lock(mu);
    Labels l = base;
    for (const auto& [k, v] : this->info)
      l.emplace_back(k, v);
    infoFam.samples.push_back(valueSample(std::move(l), 1));
  }

  Family ranks = family("gs_communicator_ranks", "Number of ranks of the communicator", T::kGauge);
  ranks.samples.push_back(valueSample(base, nranks));

  std::vector<Family> out;
  for (Family& f : linkFamilies) {
    if (!f.samples.empty())
      out.push_back(std::move(f));
  }
  for (Family* f : {&collSeconds, &collBytes, &algbw, &busbw, &inProg, &errs, &devColl, &staged,
                    &regs, &regBytes, &compErr, &infoFam, &ranks}) {
    if (!f->samples.empty())
      out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace gs::monitoring
