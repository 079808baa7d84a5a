/* Prints the C layout of the structs the Python binding mirrors (python/gradstream/_lib.py),
 * as JSON: {"struct": {"size": N, "field": offset, ...}, ...}. test_abi.py compares. */
#include <stddef.h>
#include <stdio.h>

#include "gradstream/gradstream.h"

#define FIELD(s, f) printf("%s\"%s\": %zu", first ? "" : ", ", #f, offsetof(s, f)), first = 0

int main(void) {
  int first = 1;
  printf("{\"gs_config_t\": {\"size\": %zu, ", sizeof(gs_config_t));
  FIELD(gs_config_t, struct_size);
  FIELD(gs_config_t, transport);
  FIELD(gs_config_t, timeout_ms);
  FIELD(gs_config_t, chunk_bytes);
  FIELD(gs_config_t, codec);
  FIELD(gs_config_t, metrics_address);
  FIELD(gs_config_t, slots_per_peer);
  FIELD(gs_config_t, sockets_per_peer);
  FIELD(gs_config_t, codec_ladder);
  FIELD(gs_config_t, codec_floor);
  FIELD(gs_config_t, chunk_min_bytes);
  FIELD(gs_config_t, chunk_max_bytes);
  FIELD(gs_config_t, error_budget);
  FIELD(gs_config_t, algo);
  FIELD(gs_config_t, hostname);
  FIELD(gs_config_t, shm);
  FIELD(gs_config_t, staging_bytes);
  first = 1;
  printf("},\n \"gs_comm_stats_t\": {\"size\": %zu, ", sizeof(gs_comm_stats_t));
  FIELD(gs_comm_stats_t, struct_size);
  FIELD(gs_comm_stats_t, collectives);
  FIELD(gs_comm_stats_t, errors);
  FIELD(gs_comm_stats_t, bytes_logical);
  FIELD(gs_comm_stats_t, bytes_wire);
  FIELD(gs_comm_stats_t, chunks_sent);
  FIELD(gs_comm_stats_t, chunks_received);
  FIELD(gs_comm_stats_t, compression_ratio);
  FIELD(gs_comm_stats_t, credit_wait_seconds);
  FIELD(gs_comm_stats_t, chunk_latency_p50_seconds);
  FIELD(gs_comm_stats_t, chunk_latency_p99_seconds);
  FIELD(gs_comm_stats_t, last_seconds);
  FIELD(gs_comm_stats_t, last_algbw);
  FIELD(gs_comm_stats_t, last_busbw);
  FIELD(gs_comm_stats_t, metrics_address);
  FIELD(gs_comm_stats_t, last_algorithm);
  FIELD(gs_comm_stats_t, transport);
  FIELD(gs_comm_stats_t, device_path);
  FIELD(gs_comm_stats_t, staged_collectives);
  FIELD(gs_comm_stats_t, staged_to_host_bytes);
  FIELD(gs_comm_stats_t, staged_to_device_bytes);
  FIELD(gs_comm_stats_t, buffer_registrations);
  FIELD(gs_comm_stats_t, buffer_registered_bytes);
  FIELD(gs_comm_stats_t, single_copy_bytes);
  first = 1;
  printf("},\n \"gs_stream_config_t\": {\"size\": %zu, ", sizeof(gs_stream_config_t));
  FIELD(gs_stream_config_t, struct_size);
  FIELD(gs_stream_config_t, bucket_bytes);
  FIELD(gs_stream_config_t, error_feedback);
  FIELD(gs_stream_config_t, codec);
  FIELD(gs_stream_config_t, cuda_stream);
  printf("},\n \"gs_unique_id_t\": {\"size\": %zu}, \"api_version\": {\"size\": %d}}\n",
         sizeof(gs_unique_id_t), GS_API_VERSION);
  return 0;
}
