// Gradient streams: a bucketed allreduce the caller feeds piece by piece while its backward
// pass runs (control/gradient_stream.h), and the error-feedback residual it keeps.
#include <cstddef>
#include <cstring>
#include <memory>

#include "capi/handles.h"
#include "capi/status.h"

namespace {

using gs::capi::bytesOf;
using gs::capi::checkTypes;
using gs::capi::communicator;
using gs::capi::completionCallback;
using gs::capi::guard;

gs::control::GradientStream& gradientStream(gs_stream_t s) {
  GS_ARG(s != nullptr && s->stream != nullptr, "stream is NULL");
  return *s->stream;
}

}  // namespace

extern "C" {

gs_status_t gs_stream_config_init(gs_stream_config_t* config) {
  return guard([&] {
    GS_ARG(config != nullptr, "config is NULL");
    memset(config, 0, sizeof(*config));
    config->struct_size = sizeof(*config);
    config->bucket_bytes = -1;
    config->error_feedback = 0;
    config->codec = nullptr;
    config->cuda_stream = nullptr;
  });
}

gs_status_t gs_stream_open(gs_comm_t comm,
                           void* buffer,
                           size_t count,
                           gs_dtype_t dtype,
                           gs_redop_t op,
                           const gs_stream_config_t* config,
                           gs_stream_t* out_stream) {
  return guard([&] {
    checkTypes(dtype, op);
    auto& c = communicator(comm);
    GS_ARG(out_stream != nullptr, "out_stream is NULL");
    GS_ARG(count == 0 || buffer != nullptr, "buffer is NULL");
    bytesOf(count, dtype, 1, "count");
    gs::control::GradientStreamConfig cfg;
    if (config != nullptr) {
      GS_ARG(config->struct_size >= offsetof(gs_stream_config_t, codec) + sizeof(config->codec),
             "config->struct_size %zu is too small (call gs_stream_config_init)",
             config->struct_size);
      if (config->bucket_bytes >= 0)
        cfg.bucketBytes = static_cast<size_t>(config->bucket_bytes);
      cfg.errorFeedback = config->error_feedback != 0;
      if (config->codec != nullptr)
        cfg.codec = config->codec;
      if (config->struct_size >= offsetof(gs_stream_config_t, cuda_stream) + sizeof(void*))
        cfg.cudaStream = config->cuda_stream;
    }
    auto handle = std::make_unique<gs_stream_s>();
    handle->timeoutMs = c.config().timeoutMs;
    handle->stream = std::make_unique<gs::control::GradientStream>(
        c, buffer, count, static_cast<gs::DataType>(dtype), static_cast<gs::ReduceOp>(op), cfg);
    *out_stream = handle.release();
  });
}

gs_status_t gs_stream_begin(gs_stream_t stream) {
  return guard([&] { gradientStream(stream).begin(); });
}

gs_status_t gs_stream_ready(gs_stream_t stream, size_t offset, size_t count) {
  return guard([&] { gradientStream(stream).ready(offset, count); });
}

gs_status_t gs_stream_wait(gs_stream_t stream, int timeout_ms) {
  return guard([&] {
    auto& s = gradientStream(stream);
    s.wait(timeout_ms >= 0 ? timeout_ms : stream->timeoutMs);
  });
}

gs_status_t gs_stream_on_complete(gs_stream_t stream, gs_completion_fn fn, void* user_data) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(fn != nullptr, "fn is NULL");
    s.onComplete(completionCallback(fn, user_data));
  });
}

gs_status_t gs_stream_close(gs_stream_t stream) {
  return guard([&] { delete stream; });
}

gs_status_t gs_stream_residual_bytes(gs_stream_t stream, size_t* out_bytes) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(out_bytes != nullptr, "out_bytes is NULL");
    *out_bytes = s.residualBytes();
  });
}

gs_status_t gs_stream_save_residual(gs_stream_t stream, void* out, size_t bytes) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(out != nullptr || bytes == 0, "out is NULL");
    s.saveResidual(out, bytes);
  });
}

gs_status_t gs_stream_load_residual(gs_stream_t stream, const void* in, size_t bytes) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(in != nullptr || bytes == 0, "in is NULL");
    s.loadResidual(in, bytes);
  });
}

}  // extern "C"
