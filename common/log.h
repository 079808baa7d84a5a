#pragma once

namespace gs {

enum class LogLevel : int { kNone = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4, kTrace = 5 };

/// Process-wide log threshold; set once from Config (GS_DEBUG), readable from any thread.
void setLogLevel(LogLevel level) noexcept;
LogLevel logLevel() noexcept;
/// Rank shown in the log prefix of the calling thread (-1: none).
void setLogRank(int rank) noexcept;

void logMessage(LogLevel level, const char* file, int line, const char* fmt, ...) noexcept
    __attribute__((format(printf, 4, 5)));

}  // namespace gs

#define GS_LOG_AT(level, ...)                                          \
  do {                                                                 \
    if (static_cast<int>(level) <= static_cast<int>(::gs::logLevel())) \
      ::gs::logMessage((level), __FILE__, __LINE__, __VA_ARGS__);      \
  } while (0)
#define GS_LOG_ERROR(...) GS_LOG_AT(::gs::LogLevel::kError, __VA_ARGS__)
#define GS_LOG_WARN(...) GS_LOG_AT(::gs::LogLevel::kWarn, __VA_ARGS__)
#define GS_LOG_INFO(...) GS_LOG_AT(::gs::LogLevel::kInfo, __VA_ARGS__)
#define GS_LOG_DEBUG(...) GS_LOG_AT(::gs::LogLevel::kDebug, __VA_ARGS__)
#define GS_LOG_TRACE(...) GS_LOG_AT(::gs::LogLevel::kTrace, __VA_ARGS__)
