#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"

namespace gs {

const char* errcName(Errc code) noexcept {
  switch (code) {
    case Errc::kOk:
      return "success";
    case Errc::kInProgress:
      return "in progress";
    case Errc::kInvalidArgument:
      return "invalid argument";
    case Errc::kUnsupported:
      return "unsupported";
    case Errc::kNoMemory:
      return "out of memory";
    case Errc::kSystem:
      return "system error";
    case Errc::kRemote:
      return "remote error";
    case Errc::kTimeout:
      return "timeout";
    case Errc::kAborted:
      return "aborted";
    case Errc::kInternal:
      return "internal error";
  }
  return "unknown status";
}

std::string formatString(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0)
    vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

void throwError(Errc code, const char* file, int line, const std::string& message) {
  GS_LOG_DEBUG("error at %s:%d: %s", file, line, message.c_str());
  throw Error(code, message);
}

void throwSystemError(int err, const char* file, int line, const char* what) {
  throwError(Errc::kSystem, file, line, formatString("%s failed: %s", what, strerror(err)));
}

}  // namespace gs
