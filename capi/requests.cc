// Requests of the non-blocking collectives: completion callbacks, test, wait and free.
#include <memory>

#include "capi/handles.h"
#include "capi/status.h"
#include "common/clock.h"
#include "common/error.h"

namespace {

using gs::Errc;
using gs::capi::completionCallback;
using gs::capi::guard;
using gs::capi::guardStatus;
using gs::capi::setLastError;

// A finished request's own status; its message becomes gs_last_error() when it failed.
gs_status_t requestStatus(const gs_request_t request) {
  const Errc code = request->request->status();
  if (code != Errc::kOk)
    setLastError(request->request->message().c_str());
  return static_cast<gs_status_t>(code);
}

// Waits for the request up to ms. A wait as long as the communicator's timeout may run the
// request on this thread (Communicator::wait), which the engine's timeout then bounds.
bool waitFor(const gs_request_t request, int64_t ms) {
  if (request->request->done())
    return true;
  const gs::Deadline deadline = gs::Deadline::afterMs(ms);
  if (request->comm == nullptr)
    return request->request->waitUntil(deadline);
  const bool mayRun = ms >= request->timeoutMs;
  if (!mayRun)
    request->comm->hurry(request->request);
  return request->comm->wait(request->request, deadline, mayRun);
}

}  // namespace

extern "C" {

gs_status_t gs_request_on_complete(gs_request_t request, gs_completion_fn fn, void* user_data) {
  return guard([&] {
    GS_ARG(request != nullptr && request->request != nullptr, "request is NULL");
    GS_ARG(fn != nullptr, "fn is NULL");
    // fn may free the handle (and with it this reference) while it runs: hold one of our own.
    const std::shared_ptr<gs::control::Request> keep = request->request;
    // Whoever completes through a callback may never wait: it starts without delay.
    if (request->comm != nullptr && !keep->done())
      request->comm->hurry(keep);
    keep->onComplete(completionCallback(fn, user_data));
  });
}

gs_status_t gs_test(gs_request_t request, int* out_done) {
  return guardStatus([&] {
    GS_ARG(request != nullptr, "request is NULL");
    GS_ARG(out_done != nullptr, "out_done is NULL");
    if (!request->request->done()) {
      if (request->comm != nullptr)
        request->comm->hurry(request->request);  // a polling caller runs nothing itself
      *out_done = 0;
      return GS_IN_PROGRESS;
    }
    *out_done = 1;
    return requestStatus(request);
  });
}

gs_status_t gs_wait(gs_request_t request, int timeout_ms) {
  return guardStatus([&] {
    GS_ARG(request != nullptr, "request is NULL");
    const int64_t ms = timeout_ms >= 0 ? timeout_ms : request->timeoutMs;
    if (!waitFor(request, ms)) {
      setLastError(
          gs::formatString("request still running after %lld ms", static_cast<long long>(ms))
              .c_str());
      return GS_ERR_TIMEOUT;
    }
    return requestStatus(request);
  });
}

gs_status_t gs_request_free(gs_request_t request) {
  return guardStatus([&] {
    if (request == nullptr)
      return GS_OK;
    // The progress thread may still write into the user's buffers: wait (bounded) first.
    if (!waitFor(request, request->timeoutMs)) {
      setLastError("request still running; not freed");
      return GS_ERR_TIMEOUT;
    }
    delete request;
    return GS_OK;
  });
}

}  // extern "C"
