#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/log.h"

namespace gs {

/// Every tunable of the library. Built from defaults, then the caller's gs_config_t, then the
/// GS_* environment (which wins), in exactly one place (config.cc). Components receive a
/// Config and never read the environment themselves.
struct Config {
  std::string transport = "auto";  // auto | tcp | loopback
  int64_t timeoutMs = 60000;
  int64_t chunkBytes = 1 << 20;
  int64_t slotsPerPeer = 8;
  int64_t socketsPerPeer = 2;
  std::string codec = "raw";
  std::string metricsAddress;
  std::string socketIfname;  // interface for rendezvous and tcp; empty: loopback
  std::string secret;        // GS_SECRET, used by gs_comm_init_from_env
  LogLevel logLevel = LogLevel::kWarn;

  // verbs transport (GS_IB_*)
  std::string ibHca;        // "mlx5_0:1,mlx5_1" allowed devices[:port]; empty: any active
  int64_t ibGidIndex = -1;  // -1: auto (IPv4-mapped RoCEv2 GID of an up interface)
  int64_t ibTrafficClass = 0;
  int64_t ibServiceLevel = 0;
  int64_t ibQpsPerPeer = 2;  // RC queue pairs per peer (ECMP entropy)
  int64_t ibTimeout = 18;    // local ACK timeout exponent: 4.096 us * 2^t
  int64_t ibRetryCount = 7;

  // adaptive control (codec=auto; GS_CODEC_*, GS_CHUNK_*)
  std::string codecLadder = "raw,bf16,fp8e4m3,int8,int4";
  std::string codecFloor = "int4";  // never below this rung of the ladder
  int64_t chunkMinBytes = 256 << 10;
  int64_t chunkMaxBytes = 2 << 20;
  double errorBudget = 0.05;  // relative L2 error budget of sampled lossy chunks

  // topology and algorithm choice
  // auto | ring | tree | halving_doubling | hierarchical | recursive_doubling
  std::string algo = "auto";
  // auto, measured (control/algorithm_tuner.h): crowded (where a host's ranks outnumber its
  // cores and reach each other over the network) | always | off (GS_ALGO_TUNE; environment
  // only; alike on every rank)
  std::string algoTune = "crowded";
  // reduce: auto (cost model) | chain | tree | linear (GS_REDUCE_ALGO; environment only)
  std::string reduceAlgo = "auto";
  std::string hostname;  // overrides the host name used to group ranks (tests)
  bool shm = true;       // shared-memory transport between ranks of one host
  // shm: large raw chunks are read straight out of the sender's memory (process_vm_readv) where
  // the kernel allows it, one copy instead of two (GS_SHM_SINGLE_COPY; environment only)
  bool shmSingleCopy = true;
  // shm, 2 ranks: allreduce, reduce, reduce-scatter, allgather and all-to-all whose block is at
  // most this many bytes (raw) swap the blocks through mailboxes in the connection's segment
  // instead of the chunk protocol (GS_SHM_SMALL_BYTES,
  // 0..16384, 0: off; environment only)
  int64_t shmSmallBytes = 16384;
  // CUDA device buffers: each of the two pinned host slots a collective is staged through
  int64_t stagingBytes = 32 << 20;

  /// Applies the GS_* variables present in the environment. Throws kInvalidArgument naming
  /// the variable when a value does not parse or is out of range.
  void applyEnvironment();
  /// Checks ranges (chunk size, slots, ...). Throws kInvalidArgument naming the field.
  void validate() const;
};

/// One row of the configuration table, for documentation (gradstream-perf --help-env).
struct ConfigVariable {
  const char* name;
  const char* defaultValue;
  const char* help;
};
const std::vector<ConfigVariable>& configVariables();

/// Parses "error", "warn", "info", "debug", "trace", "none" (any case) or a number 0..5.
LogLevel parseLogLevel(const std::string& text);

}  // namespace gs
