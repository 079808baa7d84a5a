// gs_config_t, both ways: gs_config_init() marks every field "not set", makeConfig() reads the
// ones that are. A field added to gs_config_t is added to both, at the end of the struct, so a
// caller built against an older header (a smaller struct_size) keeps working.
#include "capi/config.h"

#include <cstddef>
#include <cstring>

#include "capi/status.h"
#include "common/log.h"

namespace gs::capi {

Config makeConfig(const gs_config_t* c) {
  Config cfg;
  if (c != nullptr) {
    GS_ARG(c->struct_size >= offsetof(gs_config_t, transport) + sizeof(c->transport),
           "config->struct_size %zu is too small (call gs_config_init)", c->struct_size);
    auto has = [&](size_t offset, size_t size) { return c->struct_size >= offset + size; };
#define GS_FIELD(f) has(offsetof(gs_config_t, f), sizeof(c->f))
    if (GS_FIELD(transport) && c->transport)
      cfg.transport = c->transport;
    if (GS_FIELD(timeout_ms) && c->timeout_ms >= 0)
      cfg.timeoutMs = c->timeout_ms;
    if (GS_FIELD(chunk_bytes) && c->chunk_bytes >= 0)
      cfg.chunkBytes = c->chunk_bytes;
    if (GS_FIELD(codec) && c->codec)
      cfg.codec = c->codec;
    if (GS_FIELD(metrics_address) && c->metrics_address)
      cfg.metricsAddress = c->metrics_address;
    if (GS_FIELD(slots_per_peer) && c->slots_per_peer >= 0)
      cfg.slotsPerPeer = c->slots_per_peer;
    if (GS_FIELD(sockets_per_peer) && c->sockets_per_peer >= 0)
      cfg.socketsPerPeer = c->sockets_per_peer;
    if (GS_FIELD(codec_ladder) && c->codec_ladder)
      cfg.codecLadder = c->codec_ladder;
    if (GS_FIELD(codec_floor) && c->codec_floor)
      cfg.codecFloor = c->codec_floor;
    if (GS_FIELD(chunk_min_bytes) && c->chunk_min_bytes >= 0)
      cfg.chunkMinBytes = c->chunk_min_bytes;
    if (GS_FIELD(chunk_max_bytes) && c->chunk_max_bytes >= 0)
      cfg.chunkMaxBytes = c->chunk_max_bytes;
    if (GS_FIELD(error_budget) && c->error_budget >= 0)
      cfg.errorBudget = c->error_budget;
    if (GS_FIELD(algo) && c->algo)
      cfg.algo = c->algo;
    if (GS_FIELD(hostname) && c->hostname)
      cfg.hostname = c->hostname;
    if (GS_FIELD(shm) && c->shm >= 0)
      cfg.shm = c->shm != 0;
    if (GS_FIELD(staging_bytes) && c->staging_bytes >= 0)
      cfg.stagingBytes = c->staging_bytes;
#undef GS_FIELD
  }
  cfg.applyEnvironment();
  cfg.validate();
  setLogLevel(cfg.logLevel);
  return cfg;
}

}  // namespace gs::capi

extern "C" {

gs_status_t gs_config_init(gs_config_t* config) {
  return gs::capi::guard([&] {
    GS_ARG(config != nullptr, "config is NULL");
    memset(config, 0, sizeof(*config));
    config->struct_size = sizeof(*config);
    config->transport = nullptr;
    config->timeout_ms = -1;
    config->chunk_bytes = -1;
    config->codec = nullptr;
    config->metrics_address = nullptr;
    config->slots_per_peer = -1;
    config->sockets_per_peer = -1;
    config->codec_ladder = nullptr;
    config->codec_floor = nullptr;
    config->chunk_min_bytes = -1;
    config->chunk_max_bytes = -1;
    config->error_budget = -1;
    config->algo = nullptr;
    config->hostname = nullptr;
    config->shm = -1;
    config->staging_bytes = -1;
  });
}

}  // extern "C"
