// The backend factory: the one place that knows which backends are built in.
#include <mutex>

#include "common/error.h"
#include "common/log.h"
#include "gradstream/build_config.h"
#include "transport/device.h"
#include "transport/loopback/device.h"
#include "transport/shm/device.h"
#include "transport/tcp/device.h"
#if GS_HAVE_VERBS
#include "transport/verbs/device.h"
#include "transport/verbs/port_select.h"
#endif

namespace gs::transport {

std::unique_ptr<Device> createDevice(const std::string& name, const DeviceOptions& options) {
  if (name == "tcp")
    return std::make_unique<tcp::Device>(options);
  if (name == "loopback")
    return std::make_unique<loopback::Device>(options);
  if (name == "shm")
    return std::make_unique<shm::Device>(options);
  if (name == "verbs") {
#if GS_HAVE_VERBS
    return std::make_unique<verbs::Device>(options);
#else
    throw Error(Errc::kUnsupported,
                "verbs transport is not built in (rebuild with libibverbs-dev installed)");
#endif
  }
  throw Error(Errc::kInvalidArgument,
              formatString("unknown transport \"%s\" (expected tcp, verbs, shm, loopback or auto)",
                           name.c_str()));
}

bool sameHostReachable(const std::string& name,
                       std::span<const uint8_t> a,
                       std::span<const uint8_t> b) {
  return name == "shm" && shm::sameDomain(a, b) && shm::sameDomain(b, a);
}

std::string resolveTransportName(const std::string& requested, const Config& config) {
  if (requested != "auto")
    return requested;
#if GS_HAVE_VERBS
  const std::string why = verbs::rdmaUnavailableReason(config);
#else
  (void)config;
  const std::string why = "the verbs transport is not built in";
#endif
  static std::once_flag logged;
  std::call_once(logged, [&] {
    if (why.empty())
      GS_LOG_INFO("transport auto: using verbs (an active RDMA port is available)");
    else
      GS_LOG_INFO("transport auto: using tcp (%s)", why.c_str());
  });
  return why.empty() ? "verbs" : "tcp";
}

}  // namespace gs::transport
