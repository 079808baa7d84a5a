#pragma once

// The one place where C++ exceptions become C status codes. Every gs_* entry point runs its body
// inside guard() or guardStatus(), so nothing throws across the C boundary; whatever was thrown
// is kept as the calling thread's gs_last_error().

#include <exception>
#include <new>
#include <utility>

#include "common/error.h"
#include "gradstream/gradstream.h"

namespace gs::capi {

/// Sets this thread's gs_last_error() text. Never throws: without memory for the message the
/// text is cleared, and the status still says what happened.
void setLastError(const char* message) noexcept;

/// Runs f; GS_OK when it returns, else the status of what it threw.
template <class F>
gs_status_t guard(F&& f) noexcept {
  try {
    std::forward<F>(f)();
    return GS_OK;
  } catch (const Error& e) {
    setLastError(e.what());
    return static_cast<gs_status_t>(e.code());
  } catch (const std::bad_alloc&) {
    setLastError("out of memory");
    return GS_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    setLastError(e.what());
    return GS_ERR_INTERNAL;
  } catch (...) {
    setLastError("unknown exception");
    return GS_ERR_INTERNAL;
  }
}

/// guard() for calls with more than one success status (GS_IN_PROGRESS, a request's own): f
/// returns the status; whatever it throws becomes one, as in guard().
template <class F>
gs_status_t guardStatus(F&& f) noexcept {
  gs_status_t status = GS_OK;
  const gs_status_t thrown = guard([&] { status = std::forward<F>(f)(); });
  return thrown != GS_OK ? thrown : status;
}

}  // namespace gs::capi

/// A failed argument check: thrown, so guard() reports it as GS_ERR_INVALID_ARGUMENT.
#define GS_ARG(cond, ...) GS_CHECK(cond, ::gs::Errc::kInvalidArgument, __VA_ARGS__)
