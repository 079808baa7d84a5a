#include "transport/verbs/port_select.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "common/log.h"

namespace gs::transport::verbs {
namespace {

struct DeviceList {
  ibv_device** devices = nullptr;
  int count = 0;
  int error = 0;
  DeviceList() {
    errno = 0;
    devices = ibv_get_device_list(&count);
    error = devices == nullptr ? (errno != 0 ? errno : ENODEV) : 0;
  }
  ~DeviceList() {
    if (devices != nullptr)
      ibv_free_device_list(devices);
  }
};

bool allowed(const std::vector<HcaFilter>& filters, const char* device, int port) {
  if (filters.empty())
    return true;
  for (const HcaFilter& f : filters) {
    if (f.device == device && (f.port == 0 || f.port == port))
      return true;
  }
  return false;
}

// An IPv4-mapped IPv6 address: ::ffff:a.b.c.d.
bool isIpv4Mapped(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, sizeof(prefix)) == 0;
}

bool isZero(const ibv_gid& gid) {
  static const ibv_gid zero{};
  return std::memcmp(gid.raw, zero.raw, sizeof(zero.raw)) == 0;
}

const char* gidTypeName(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCEv1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCEv2";
    default:
      return "unknown";
  }
}

// Chooses the GID for a RoCE port: RoCEv2 + IPv4-mapped first (what routed RoCE fabrics and
// Soft-RoCE use), then any RoCEv2, then index 0.
void chooseRoceGid(SelectedPort& p) {
  int v2Any = -1, v2Ipv4 = -1;
  for (int i = 0; i < p.attr.gid_tbl_len; ++i) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(p.context.get(), p.port, i, &e, 0) != 0 || isZero(e.gid))
      continue;
    if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
      continue;
    if (v2Any < 0)
      v2Any = i;
    if (isIpv4Mapped(e.gid)) {
      v2Ipv4 = i;
      break;
    }
  }
  p.gidIndex = v2Ipv4 >= 0 ? v2Ipv4 : (v2Any >= 0 ? v2Any : 0);
}

}  // namespace

std::vector<HcaFilter> parseHcaList(const std::string& text) {
  std::vector<HcaFilter> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos)
      end = text.size();
    std::string item;
    for (size_t i = start; i < end; ++i) {
      if (text[i] != ' ' && text[i] != '\t')
        item += text[i];
    }
    start = end + 1;
    if (item.empty())
      continue;
    HcaFilter f;
    const size_t colon = item.find(':');
    f.device = item.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string port = item.substr(colon + 1);
      char* stop = nullptr;
      const long v = strtol(port.c_str(), &stop, 10);
      GS_CHECK(!port.empty() && *stop == '\0' && v >= 1 && v <= 255, Errc::kInvalidArgument,
               "GS_IB_HCA entry \"%s\": port must be a number 1..255", item.c_str());
      f.port = static_cast<int>(v);
    }
    GS_CHECK(!f.device.empty(), Errc::kInvalidArgument, "GS_IB_HCA entry \"%s\" has no device name",
             item.c_str());
    out.push_back(f);
  }
  return out;
}

std::string gidText(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.raw, text, sizeof(text)) == nullptr)
    return "?";
  return text;
}

SelectedPort selectPort(const Config& config, int rank) {
  const std::vector<HcaFilter> filters = parseHcaList(config.ibHca);
  DeviceList list;
  GS_CHECK(list.devices != nullptr, Errc::kUnsupported,
           "verbs: no RDMA device: ibv_get_device_list failed: %s", strerror(list.error));
  GS_CHECK(list.count > 0, Errc::kUnsupported, "verbs: no RDMA device on this host");

  struct Candidate {
    int device;
    int port;
  };
  std::vector<Candidate> candidates;
  std::string seen;
  for (int d = 0; d < list.count; ++d) {
    const char* name = ibv_get_device_name(list.devices[d]);
    VerbsPtr<ibv_context> ctx(ibv_open_device(list.devices[d]));
    if (ctx == nullptr) {
      seen += formatString(" %s (cannot open: %s)", name, strerror(errno));
      continue;
    }
    ibv_device_attr dattr{};
    if (ibv_query_device(ctx.get(), &dattr) == 0) {
      for (int port = 1; port <= dattr.phys_port_cnt; ++port) {
        ibv_port_attr pattr{};
        if (ibv_query_port(ctx.get(), port, &pattr) != 0)
          continue;
        const bool active = pattr.state == IBV_PORT_ACTIVE;
        seen += formatString(" %s:%d (%s%s)", name, port, ibv_port_state_str(pattr.state),
                             allowed(filters, name, port) ? "" : ", not in GS_IB_HCA");
        if (active && allowed(filters, name, port))
          candidates.push_back({d, port});
      }
    }
  }
  GS_CHECK(!candidates.empty(), Errc::kUnsupported, "verbs: no active RDMA port to use; found:%s",
           seen.empty() ? " nothing" : seen.c_str());

  const Candidate c = candidates[static_cast<size_t>(rank) % candidates.size()];
  SelectedPort p;
  p.deviceName = ibv_get_device_name(list.devices[c.device]);
  p.port = c.port;
  p.context.reset(ibv_open_device(list.devices[c.device]));
  GS_CHECK(p.context != nullptr, Errc::kSystem, "verbs: cannot open %s: %s", p.deviceName.c_str(),
           strerror(errno));
  GS_CHECK(ibv_query_port(p.context.get(), p.port, &p.attr) == 0, Errc::kSystem,
           "verbs: cannot query %s: %s", p.name().c_str(), strerror(errno));
  p.ethernet = p.attr.link_layer == IBV_LINK_LAYER_ETHERNET;

  if (config.ibGidIndex >= 0) {
    GS_CHECK(config.ibGidIndex < p.attr.gid_tbl_len, Errc::kInvalidArgument,
             "GS_IB_GID_INDEX=%lld: %s has only %d GIDs", static_cast<long long>(config.ibGidIndex),
             p.name().c_str(), p.attr.gid_tbl_len);
    p.gidIndex = static_cast<int>(config.ibGidIndex);
  } else if (p.ethernet) {
    chooseRoceGid(p);
  } else {
    p.gidIndex = 0;
  }
  ibv_gid_entry entry{};
  GS_CHECK(
      ibv_query_gid_ex(p.context.get(), p.port, p.gidIndex, &entry, 0) == 0 && !isZero(entry.gid),
      Errc::kInvalidArgument, "verbs: GID index %d of %s is empty or unreadable%s", p.gidIndex,
      p.name().c_str(), config.ibGidIndex >= 0 ? " (set by GS_IB_GID_INDEX)" : "");
  p.gid = entry.gid;
  p.gidDescription = formatString("%s (index %d, %s)", gidText(p.gid).c_str(), p.gidIndex,
                                  gidTypeName(entry.gid_type));
  return p;
}

std::string rdmaUnavailableReason(const Config& config) {
  try {
    SelectedPort p = selectPort(config, 0);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace gs::transport::verbs
