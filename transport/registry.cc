// The backend factory: the one place that knows which backends are built in.
#include <mutex>

#include "common/error.h"
#include "common/log.h"
#include "transport/device.h"
#include "transport/loopback/device.h"
#include "transport/tcp/device.h"

namespace gs::transport {

std::unique_ptr<Device> createDevice(const std::string& name, const DeviceOptions& options) {
  if (name == "tcp")
    return std::make_unique<tcp::Device>(options);
  if (name == "loopback")
    return std::make_unique<loopback::Device>(options);
  if (name == "verbs") {
    throw Error(Errc::kUnsupported, "verbs transport is not built in this version");
  }
  throw Error(
      Errc::kInvalidArgument,
      formatString("unknown transport \"%s\" (expected tcp, loopback or auto)", name.c_str()));
}

std::string resolveTransportName(const std::string& requested) {
  if (requested != "auto")
    return requested;
  static std::once_flag logged;
  std::call_once(logged, [] {
    GS_LOG_INFO("transport auto: using tcp (no RDMA device support is built into this version)");
  });
  return "tcp";
}

}  // namespace gs::transport
