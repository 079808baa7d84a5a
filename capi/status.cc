// Status codes and the last-error text: what guard() (status.h) leaves for the C caller.
#include "capi/status.h"

#include <string>

#include "common/log.h"
#include "common/types.h"

namespace gs::capi {
namespace {

// The C enumerations are the C++ ones passed through a cast: status codes are Errc values,
// gs_dtype_t and gs_redop_t are DataType and ReduceOp.
#define GS_SAME(c, e) static_assert(static_cast<int>(c) == static_cast<int>(e), #c)
GS_SAME(GS_OK, Errc::kOk);
GS_SAME(GS_IN_PROGRESS, Errc::kInProgress);
GS_SAME(GS_ERR_INVALID_ARGUMENT, Errc::kInvalidArgument);
GS_SAME(GS_ERR_UNSUPPORTED, Errc::kUnsupported);
GS_SAME(GS_ERR_NO_MEMORY, Errc::kNoMemory);
GS_SAME(GS_ERR_SYSTEM, Errc::kSystem);
GS_SAME(GS_ERR_REMOTE, Errc::kRemote);
GS_SAME(GS_ERR_TIMEOUT, Errc::kTimeout);
GS_SAME(GS_ERR_ABORTED, Errc::kAborted);
GS_SAME(GS_ERR_INTERNAL, Errc::kInternal);
GS_SAME(GS_FLOAT32, DataType::kFloat32);
GS_SAME(GS_FLOAT16, DataType::kFloat16);
GS_SAME(GS_BFLOAT16, DataType::kBFloat16);
GS_SAME(GS_FLOAT64, DataType::kFloat64);
GS_SAME(GS_INT32, DataType::kInt32);
GS_SAME(GS_INT64, DataType::kInt64);
GS_SAME(GS_UINT8, DataType::kUInt8);
GS_SAME(GS_SUM, ReduceOp::kSum);
GS_SAME(GS_AVG, ReduceOp::kAvg);
GS_SAME(GS_MIN, ReduceOp::kMin);
GS_SAME(GS_MAX, ReduceOp::kMax);
GS_SAME(GS_PROD, ReduceOp::kProd);
#undef GS_SAME

thread_local std::string tLastError;

}  // namespace

void setLastError(const char* message) noexcept {
  try {
    tLastError = message;
  } catch (...) {
    tLastError.clear();  // no memory for the message: the status still says what happened
  }
  GS_LOG_DEBUG("returning error: %s", message);
}

}  // namespace gs::capi

extern "C" {

const char* gs_status_string(gs_status_t status) {
  switch (status) {
    case GS_OK:
      return "GS_OK";
    case GS_IN_PROGRESS:
      return "GS_IN_PROGRESS";
    case GS_ERR_INVALID_ARGUMENT:
      return "GS_ERR_INVALID_ARGUMENT";
    case GS_ERR_UNSUPPORTED:
      return "GS_ERR_UNSUPPORTED";
    case GS_ERR_NO_MEMORY:
      return "GS_ERR_NO_MEMORY";
    case GS_ERR_SYSTEM:
      return "GS_ERR_SYSTEM";
    case GS_ERR_REMOTE:
      return "GS_ERR_REMOTE";
    case GS_ERR_TIMEOUT:
      return "GS_ERR_TIMEOUT";
    case GS_ERR_ABORTED:
      return "GS_ERR_ABORTED";
    case GS_ERR_INTERNAL:
      return "GS_ERR_INTERNAL";
  }
  return "unknown gs_status_t";
}

const char* gs_last_error(void) {
  return gs::capi::tLastError.c_str();
}

}  // extern "C"
