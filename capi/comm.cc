// Communicator lifetime: the library and API versions, the unique id, the two ways to create a
// communicator, what it reports (rank, size, stats), abort and destroy.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "capi/config.h"
#include "capi/handles.h"
#include "capi/status.h"
#include "common/log.h"
#include "control/bootstrap.h"
#include "control/launch_env.h"
#include "control/unique_id.h"
#include "gradstream/build_config.h"

namespace {

using gs::Errc;
using gs::capi::communicator;
using gs::capi::guard;
using gs::capi::makeConfig;

static_assert(sizeof(gs_unique_id_t) == gs::control::UniqueId::kBytes, "unique id size");

void checkApiVersion(int version) {
  GS_CHECK(version / 10000 == GS_VERSION_MAJOR, Errc::kUnsupported,
           "application built against gradstream API %d, library is %d", version, GS_API_VERSION);
}

}  // namespace

extern "C" {

const char* gs_version_string(void) {
  return "0.1.0";
}

gs_status_t gs_get_unique_id(gs_unique_id_t* out_id) {
  return guard([&] {
    GS_ARG(out_id != nullptr, "out_id is NULL");
    const gs::Config cfg = makeConfig(nullptr);
    auto bytes = gs::control::createUniqueId(cfg).serialize();
    memcpy(out_id->internal, bytes.data(), bytes.size());
  });
}

gs_status_t gs_comm_init_rank_version(gs_comm_t* out_comm,
                                      int nranks,
                                      const gs_unique_id_t* id,
                                      int rank,
                                      const gs_config_t* config,
                                      int api_version) {
  return guard([&] {
    checkApiVersion(api_version);
    GS_ARG(out_comm != nullptr, "out_comm is NULL");
    GS_ARG(id != nullptr, "id is NULL");
    GS_ARG(nranks >= 1, "nranks %d must be >= 1", nranks);
    GS_ARG(rank >= 0 && rank < nranks, "rank %d is out of range [0, %d)", rank, nranks);
    const gs::Config cfg = makeConfig(config);
    gs::setLogRank(rank);
    auto uid = gs::control::UniqueId::parse(
        {reinterpret_cast<const uint8_t*>(id->internal), sizeof(id->internal)});
    auto handle = std::make_unique<gs_comm_s>();
    handle->comm = gs::control::Communicator::create(nranks, uid, rank, cfg);
    *out_comm = handle.release();
  });
}

gs_status_t gs_comm_init_from_env_version(gs_comm_t* out_comm,
                                          const gs_config_t* config,
                                          int api_version) {
  return guard([&] {
    checkApiVersion(api_version);
    GS_ARG(out_comm != nullptr, "out_comm is NULL");
    const gs::Config cfg = makeConfig(config);
    auto handle = std::make_unique<gs_comm_s>();
    handle->comm = gs::control::createFromEnvironment(cfg);
    gs::setLogRank(handle->comm->rank());
    *out_comm = handle.release();
  });
}

gs_status_t gs_comm_split(
    gs_comm_t comm, int color, int key, const gs_config_t* config, gs_comm_t* out_comm) {
  return guard([&] {
    auto& parent = communicator(comm);
    GS_ARG(out_comm != nullptr, "out_comm is NULL");
    *out_comm = nullptr;
    // No config: the child runs with the parent's settings (NCCL's ncclCommSplit likewise).
    auto child = parent.split(
        color, key, [&] { return config != nullptr ? makeConfig(config) : parent.config(); });
    if (!child)
      return;  // GS_SPLIT_NOCOLOR
    auto handle = std::make_unique<gs_comm_s>();
    handle->comm = std::move(child);
    *out_comm = handle.release();
  });
}

gs_status_t gs_comm_rank(gs_comm_t comm, int* out_rank) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(out_rank != nullptr, "out_rank is NULL");
    *out_rank = c.rank();
  });
}

gs_status_t gs_comm_size(gs_comm_t comm, int* out_size) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(out_size != nullptr, "out_size is NULL");
    *out_size = c.size();
  });
}

gs_status_t gs_comm_stats(gs_comm_t comm, gs_comm_stats_t* out_stats) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(out_stats != nullptr, "out_stats is NULL");
    GS_ARG(out_stats->struct_size >= offsetof(gs_comm_stats_t, errors),
           "out_stats->struct_size %zu is too small (set it to sizeof(gs_comm_stats_t))",
           out_stats->struct_size);
    const auto st = c.stats();
    const auto& snap = st.snapshot;
    gs_comm_stats_t v;
    memset(&v, 0, sizeof(v));
    v.struct_size = std::min(out_stats->struct_size, sizeof(v));
    v.collectives = snap.collectives;
    v.errors = snap.errorsTotal;
    v.bytes_logical = snap.bytesLogical;
    v.bytes_wire = snap.bytesWire;
    v.chunks_sent = snap.chunksSent;
    v.chunks_received = snap.chunksReceived;
    v.compression_ratio = snap.compressionRatio();
    v.credit_wait_seconds = static_cast<double>(snap.creditWaitNs) * 1e-9;
    // Latency quantiles over all links: the slowest link's bucket bound.
    for (const auto& l : snap.links) {
      v.chunk_latency_p50_seconds =
          std::max(v.chunk_latency_p50_seconds, l.latencyQuantileSeconds(0.5));
      v.chunk_latency_p99_seconds =
          std::max(v.chunk_latency_p99_seconds, l.latencyQuantileSeconds(0.99));
    }
    v.last_seconds = st.lastSeconds;
    v.last_algbw = st.lastAlgbw;
    v.last_busbw = st.lastBusbw;
    snprintf(v.metrics_address, sizeof(v.metrics_address), "%s", st.metricsAddress.c_str());
    snprintf(v.last_algorithm, sizeof(v.last_algorithm), "%s", st.lastAlgorithm.c_str());
    snprintf(v.transport, sizeof(v.transport), "%s", c.transportName().c_str());
    snprintf(v.device_path, sizeof(v.device_path), "%s",
             st.snapshot.stagedCollectives > 0 ? "pinned_host_staging" : "");
    v.staged_collectives = st.snapshot.stagedCollectives;
    v.staged_to_host_bytes = st.snapshot.stagedToHostBytes;
    v.staged_to_device_bytes = st.snapshot.stagedToDeviceBytes;
    v.buffer_registrations = st.snapshot.bufferRegistrations;
    v.buffer_registered_bytes = st.snapshot.bufferRegisteredBytes;
    v.single_copy_bytes = snap.singleCopyBytes;
    // Versioned copy: only what the caller's struct has room for.
    memcpy(out_stats, &v, v.struct_size);
  });
}

gs_status_t gs_comm_abort(gs_comm_t comm) {
  return guard([&] { communicator(comm).abort(); });
}

gs_status_t gs_comm_destroy(gs_comm_t comm) {
  return guard([&] { delete comm; });
}

}  // extern "C"
