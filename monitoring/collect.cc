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

  Family bytesLogical =
      family("gs_bytes_logical_total",
             "Bytes of the user's data type sent to a peer (before encoding)", T::kCounter);
  Family bytesWire =
      family("gs_bytes_wire_total",
             "Bytes sent on the wire to a peer (encoded payload and headers)", T::kCounter);
  Family chunks = family("gs_chunks_total", "Chunks sent to a peer, by codec", T::kCounter);
  Family chunksRecv =
      family("gs_chunks_received_total", "Chunks received from a peer", T::kCounter);
  Family bytesRecv =
      family("gs_bytes_received_total", "Wire bytes received from a peer", T::kCounter);
  Family goodput =
      family("gs_link_goodput_bytes_per_second",
             "Logical bytes per second sent to a peer during the last collective", T::kGauge);
  Family latency = family("gs_chunk_latency_seconds",
                          "Post-to-completion latency of chunks sent to a peer", T::kHistogram);
  Family chunkSize =
      family("gs_chunk_size_bytes", "Chunk size currently used towards a peer", T::kGauge);
  Family rung = family("gs_codec_rung",
                       "Codec currently chosen towards a peer (0 raw, 1 fp16, 2 bf16, 3 fp8e4m3, "
                       "4 fp8e5m2, 5 int8, 6 int4, 7 topk)",
                       T::kGauge);
  Family creditWait =
      family("gs_credit_wait_seconds_total",
             "Time spent ready to send to a peer but waiting for a credit", T::kCounter);
  Family encode = family("gs_encode_seconds_total",
                         "Time spent encoding chunks for a peer (lossy codecs)", T::kCounter);
  Family rtt =
      family("gs_link_rtt_seconds",
             "Round-trip time the transport measures towards a peer (tcp: TCP_INFO)", T::kGauge);
  Family retrans = family("gs_link_retransmits_total",
                          "Retransmitted segments towards a peer (tcp: TCP_INFO)", T::kCounter);
  Family cwnd =
      family("gs_link_cwnd_bytes",
             "Congestion window towards a peer, summed over sockets (tcp: TCP_INFO)", T::kGauge);
  Family lastProgress =
      family("gs_last_progress_timestamp_seconds",
             "Unix time of the last chunk completed or received on a link", T::kGauge);
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
      bytesLogical.samples.push_back(
          valueSample(pl, static_cast<double>(lc->bytesLogical.load(r))));
      bytesWire.samples.push_back(valueSample(pl, static_cast<double>(lc->bytesWire.load(r))));
      for (int c = 0; c < kMaxCodecs; ++c) {
        chunks.samples.push_back(valueSample(linkWith({{"peer", peer}, {"codec", kCodecNames[c]}}),
                                             static_cast<double>(lc->chunksByCodec[c].load(r))));
      }
      chunksRecv.samples.push_back(
          valueSample(pl, static_cast<double>(lc->chunksReceived.load(r))));
      bytesRecv.samples.push_back(valueSample(pl, static_cast<double>(lc->bytesReceived.load(r))));
      goodput.samples.push_back(valueSample(pl, lc->goodputBytesPerSecond.load(r)));
      latency.samples.push_back(histogramSample(pl, lc->chunkLatency, kChunkLatencyBoundsNs));
      chunkSize.samples.push_back(valueSample(pl, static_cast<double>(lc->chunkSizeBytes.load(r))));
      rung.samples.push_back(valueSample(pl, lc->codecRung.load(r)));
      creditWait.samples.push_back(
          valueSample(pl, static_cast<double>(lc->creditWaitNs.load(r)) * 1e-9));
      encode.samples.push_back(valueSample(pl, static_cast<double>(lc->encodeNs.load(r)) * 1e-9));
      rtt.samples.push_back(valueSample(pl, lc->transportRttSeconds.load(r)));
      retrans.samples.push_back(
          valueSample(pl, static_cast<double>(lc->transportRetransmits.load(r))));
      cwnd.samples.push_back(valueSample(pl, static_cast<double>(lc->transportCwndBytes.load(r))));
      lastProgress.samples.push_back(
          valueSample(pl, static_cast<double>(lc->lastProgressUnixNs.load(r)) * 1e-9));
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
  for (Family* f :
       {&bytesLogical, &bytesWire,   &chunks,     &chunksRecv, &bytesRecv, &goodput, &latency,
        &chunkSize,    &rung,        &creditWait, &encode,     &rtt,       &retrans, &cwnd,
        &lastProgress, &collSeconds, &collBytes,  &algbw,      &busbw,     &inProg,  &errs,
        &devColl,      &staged,      &compErr,    &infoFam,    &ranks}) {
    if (!f->samples.empty())
      out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace gs::monitoring
