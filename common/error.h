#pragma once

#include <stdexcept>
#include <string>

namespace gs {

/// Error codes; mirror gs_status_t one to one (capi/ static_asserts each value).
enum class Errc : int {
  kOk = 0,
  kInProgress = 1,
  kInvalidArgument = -1,
  kUnsupported = -2,
  kNoMemory = -3,
  kSystem = -4,
  kRemote = -5,
  kTimeout = -6,
  kAborted = -7,
  kInternal = -8,
};

const char* errcName(Errc code) noexcept;

/// The one exception type of the library: a code plus a message that names the argument,
/// peer or device at fault. Thrown on setup and control paths; the data path returns values.
class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

/// Formats like printf into a std::string.
std::string formatString(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void throwError(Errc code, const char* file, int line, const std::string& message);
[[noreturn]] void throwSystemError(int err, const char* file, int line, const char* what);

}  // namespace gs

/// Throws gs::Error(errc, formatted message) when cond is false.
#define GS_CHECK(cond, errc, ...)                                                    \
  do {                                                                               \
    if (!(cond))                                                                     \
      ::gs::throwError((errc), __FILE__, __LINE__, ::gs::formatString(__VA_ARGS__)); \
  } while (0)

/// Throws gs::Error(kSystem) naming the call and errno when a POSIX call returns -1.
#define GS_CHECK_ERRNO(expr)                                    \
  do {                                                          \
    if ((expr) == -1)                                           \
      ::gs::throwSystemError(errno, __FILE__, __LINE__, #expr); \
  } while (0)
