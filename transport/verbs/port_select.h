#pragma once

#include <string>
#include <vector>

#include <infiniband/verbs.h>

#include "common/config.h"
#include "transport/verbs/handles.h"

namespace gs::transport::verbs {

/// One entry of GS_IB_HCA: a device name and optionally a port (0: any active port).
struct HcaFilter {
  std::string device;
  int port = 0;
};

/// Parses GS_IB_HCA ("mlx5_0:1,mlx5_1", whitespace ignored). An empty string means any device.
/// Throws kInvalidArgument naming the malformed entry.
std::vector<HcaFilter> parseHcaList(const std::string& text);

/// The port this rank uses, with its GID and MTU: everything a connection's address needs.
/// Owns the opened device context.
struct SelectedPort {
  VerbsPtr<ibv_context> context;
  std::string deviceName;
  int port = 0;
  ibv_port_attr attr{};
  bool ethernet = false;  // RoCE (link layer Ethernet) rather than InfiniBand
  int gidIndex = 0;
  ibv_gid gid{};
  std::string gidDescription;  // "::ffff:10.77.0.1 (index 1, RoCEv2)"
  std::string name() const { return deviceName + ":" + std::to_string(port); }
};

/// Opens the first active port allowed by config.ibHca (spreading ranks over several allowed
/// ports by rank) and picks its GID: config.ibGidIndex when >= 0, else for RoCE the RoCEv2 GID
/// holding an IPv4-mapped address, then any RoCEv2 GID, then index 0; index 0 on InfiniBand.
/// Throws kUnsupported (no device, no active port) or kInvalidArgument (GID index unusable).
SelectedPort selectPort(const Config& config, int rank);

/// Why no verbs device can be used here ("" when an active port exists). Cheap enough to call
/// once per process; never throws.
std::string rdmaUnavailableReason(const Config& config);

/// Text form of a GID ("fe80::..." or "::ffff:a.b.c.d").
std::string gidText(const ibv_gid& gid);

}  // namespace gs::transport::verbs
