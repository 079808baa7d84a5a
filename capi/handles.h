#pragma once

// What the C API's opaque handles hold, and the checks every entry point shares: a handle that
// is NULL, a dtype or op that is not one of ours, a count whose bytes overflow. Internal to
// libgradstream.so (hidden visibility; only gs_* is exported).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "control/communicator.h"
#include "control/gradient_stream.h"
#include "gradstream/gradstream.h"

struct gs_comm_s {
  std::unique_ptr<gs::control::Communicator> comm;
};

struct gs_stream_s {
  std::unique_ptr<gs::control::GradientStream> stream;
  int64_t timeoutMs;  // the communicator's, for gs_stream_wait(timeout_ms < 0)
};

struct gs_request_s {
  std::shared_ptr<gs::control::Request> request;
  int64_t timeoutMs;  // the communicator's, for gs_wait(timeout_ms < 0) and gs_request_free
  // Who runs it, so a waiter can run it itself (Communicator::wait). Only used while the
  // request is unfinished, when the communicator still exists (gs_comm_destroy waits for its
  // requests); null for requests finished at issue.
  gs::control::Communicator* comm = nullptr;
};

namespace gs::capi {

/// The communicator behind comm; throws kInvalidArgument for a NULL handle.
control::Communicator& communicator(gs_comm_t comm);

/// The integer a C caller passed as an enum. Read through memcpy: in C++ loading an enum object
/// whose value is outside the enumerators' range is undefined, and C callers may pass anything.
template <class Enum>
int enumValue(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

/// Throws kInvalidArgument unless dtype and op are enumerators. Takes them by reference for the
/// reason enumValue() reads through memcpy.
void checkTypes(const gs_dtype_t& dtype, const gs_redop_t& op);

/// count elements of dtype, `times` over, in bytes; throws kInvalidArgument (naming `what`) when
/// that overflows size_t. dtype must have passed checkTypes().
size_t bytesOf(size_t count, gs_dtype_t dtype, size_t times, const char* what);

/// A C completion callback as a Request callback: the message is valid only during the call.
control::Request::Callback completionCallback(gs_completion_fn fn, void* user);

}  // namespace gs::capi
