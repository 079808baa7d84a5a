#include "transport/verbs/handles.h"

#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace gs::transport::verbs {

void reportTeardown(int rc, const char* call) noexcept {
  if (rc == 0)
    return;
  const int reason = rc > 0 ? rc : errno;
  GS_LOG_WARN("verbs: %s failed: %s", call, strerror(reason));
}

}  // namespace gs::transport::verbs
