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
