#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

namespace gs {
namespace {

std::atomic<int> gLevel{static_cast<int>(LogLevel::kWarn)};
thread_local int tRank = -1;

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kNone:
      break;
  }
  return "?";
}

}  // namespace

void setLogLevel(LogLevel level) noexcept {
  gLevel.store(static_cast<int>(level));
}
LogLevel logLevel() noexcept {
  return static_cast<LogLevel>(gLevel.load(std::memory_order_relaxed));
}
void setLogRank(int rank) noexcept {
  tRank = rank;
}

void logMessage(LogLevel level, const char* file, int line, const char* fmt, ...) noexcept {
  char body[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(body, sizeof(body), fmt, args);
  va_end(args);
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  char rank[24] = "";
  if (tRank >= 0)
    snprintf(rank, sizeof(rank), " rank %d", tRank);
  // One fprintf per line so lines of concurrent ranks do not interleave mid-line.
  fprintf(stderr, "gradstream %d%s %s %s:%d: %s\n", static_cast<int>(getpid()), rank,
          levelName(level), base, line, body);
}

}  // namespace gs
