#include "control/gradient_stream.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "common/error.h"

namespace gs::control {

GradientStream::GradientStream(Communicator& comm,
                               void* buffer,
                               size_t count,
                               DataType dtype,
                               ReduceOp op,
                               const GradientStreamConfig& config)
    : comm_(comm),
      buffer_(static_cast<uint8_t*>(buffer)),
      count_(count),
      dtype_(dtype),
      op_(op),
      elementSize_(elementSize(dtype)),
      errorFeedback_(config.errorFeedback),
      cudaStream_(config.cudaStream) {
  GS_CHECK(buffer != nullptr || count == 0, Errc::kInvalidArgument, "buffer is NULL");
  GS_CHECK(config.bucketBytes >= static_cast<size_t>(elementSize_), Errc::kInvalidArgument,
           "bucket_bytes %zu is smaller than one element", config.bucketBytes);
  if (!config.codec.empty()) {
    const codecs::CodecSpec spec = codecs::CodecSpec::parse(config.codec);
    codec_ = codecs::makeCodec(spec);
  }
  const size_t perBucket = std::max<size_t>(1, config.bucketBytes / elementSize_);
  for (size_t off = 0; off < count; off += perBucket) {
    Bucket b;
    b.offset = off;
    b.count = std::min(perBucket, count - off);
    buckets_.push_back(std::move(b));
  }
  if (errorFeedback_) {
    const size_t rsize = codecs::residualElementSize(dtype);
    GS_CHECK(rsize > 0, Errc::kInvalidArgument,
             "error feedback needs a floating-point buffer, not %s", dataTypeName(dtype));
    residual_.assign(count * rsize, 0);
  }
}

GradientStream::~GradientStream() {
  // The progress thread may still write into the buffer: wait (bounded) for what was handed over.
  try {
    waitAll(Deadline::afterMs(comm_.config().timeoutMs));
  } catch (const std::exception&) {
    // Reported by wait(); closing must not throw.
  }
}

void GradientStream::begin() {
  for (const Bucket& b : buckets_) {
    GS_CHECK(b.request == nullptr || b.request->done(), Errc::kInvalidArgument,
             "gs_stream_begin: the previous iteration is still running (call gs_stream_wait)");
  }
  GS_CHECK(!inIteration_ || nextToSubmit_ == buckets_.size(), Errc::kInvalidArgument,
           "gs_stream_begin: the previous iteration has ranges never marked ready");
  for (Bucket& b : buckets_) {
    b.readyCount = 0;
    b.request.reset();
  }
  marked_.clear();
  nextToSubmit_ = 0;
  inIteration_ = true;
}

void GradientStream::ready(size_t offset, size_t count) {
  GS_CHECK(inIteration_, Errc::kInvalidArgument, "gs_stream_ready before gs_stream_begin");
  GS_CHECK(offset <= count_ && count <= count_ - offset, Errc::kInvalidArgument,
           "range [%zu, %zu) is outside the stream's %zu elements", offset, offset + count, count_);
  if (count == 0)
    return;
  const size_t end = offset + count;
  // Marking an element twice would reduce a bucket early or never: an error.
  auto next = marked_.lower_bound(offset);
  GS_CHECK(next == marked_.end() || next->first >= end, Errc::kInvalidArgument,
           "range [%zu, %zu) overlaps [%zu, %zu) already marked in this iteration", offset, end,
           next == marked_.end() ? 0 : next->first, next == marked_.end() ? 0 : next->second);
  if (next != marked_.begin()) {
    auto prev = std::prev(next);
    GS_CHECK(prev->second <= offset, Errc::kInvalidArgument,
             "range [%zu, %zu) overlaps [%zu, %zu) already marked in this iteration", offset, end,
             prev->first, prev->second);
  }
  marked_[offset] = end;
  for (Bucket& b : buckets_) {
    const size_t lo = std::max(offset, b.offset), hi = std::min(end, b.offset + b.count);
    if (lo < hi)
      b.readyCount += hi - lo;
  }
  submitReady();
}

void GradientStream::submitReady() {
  while (nextToSubmit_ < buckets_.size()) {
    Bucket& b = buckets_[buckets_.size() - 1 - nextToSubmit_];
    if (b.readyCount < b.count)
      return;
    uint8_t* data = buffer_ + b.offset * elementSize_;
    stream::CollectiveArgs args;
    args.kind = stream::CollectiveKind::kAllReduce;
    args.send = data;
    args.recv = data;
    args.count = b.count;
    args.dtype = dtype_;
    args.op = op_;
    if (codec_ && codec_->supports(dtype_))
      args.codec = codec_.get();
    // The communicator adds the residual once the stream's producers are done.
    if (errorFeedback_)
      args.residual = residual_.data() + b.offset * codecs::residualElementSize(dtype_);
    b.request = comm_.submit(args, cudaStream_);
    ++nextToSubmit_;
  }
}

void GradientStream::waitAll(Deadline deadline) {
  for (const Bucket& b : buckets_) {
    if (b.request == nullptr)
      continue;
    GS_CHECK(b.request->waitUntil(deadline), Errc::kTimeout,
             "gs_stream_wait: bucket [%zu, %zu) not reduced before the deadline", b.offset,
             b.offset + b.count);
  }
}

void GradientStream::checkAllMarked(const char* call) const {
  GS_CHECK(inIteration_, Errc::kInvalidArgument, "%s before gs_stream_begin", call);
  if (nextToSubmit_ < buckets_.size()) {
    const Bucket& b = buckets_[buckets_.size() - 1 - nextToSubmit_];
    GS_CHECK(false, Errc::kInvalidArgument,
             "%s: elements of [%zu, %zu) were never marked ready (%zu of %zu are)", call, b.offset,
             b.offset + b.count, b.readyCount, b.count);
  }
}

void GradientStream::onComplete(Request::Callback fn) {
  checkAllMarked("gs_stream_on_complete");
  // Shared by the buckets' callbacks: the last one to finish reports the iteration.
  struct Pending {
    std::mutex mutex;
    size_t left = 0;
    Errc code = Errc::kOk;
    std::string message;
    Request::Callback fn;
  };
  auto pending = std::make_shared<Pending>();
  pending->fn = std::move(fn);
  std::vector<std::shared_ptr<Request>> requests;
  for (size_t i = 0; i < buckets_.size(); ++i) {  // reduction order: last bucket first
    const auto& request = buckets_[buckets_.size() - 1 - i].request;
    if (request != nullptr)
      requests.push_back(request);
  }
  if (requests.empty()) {
    pending->fn(Errc::kOk, "");
    return;
  }
  pending->left = requests.size();
  // Requests complete in issue order (the reduction order), so the first failure seen is the
  // first in that order.
  for (const auto& request : requests) {
    request->onComplete([pending](Errc code, const std::string& message) {
      bool last = false;
      {
        std::lock_guard<std::mutex> lock(pending->mutex);
        if (code != Errc::kOk && pending->code == Errc::kOk) {
          pending->code = code;
          pending->message = message;
        }
        last = --pending->left == 0;
      }
      if (last)
        pending->fn(pending->code, pending->message);
    });
  }
}

void GradientStream::wait(int64_t timeoutMs) {
  checkAllMarked("gs_stream_wait");
  waitAll(Deadline::afterMs(timeoutMs));
  for (const Bucket& b : buckets_) {
    if (b.request && b.request->status() != Errc::kOk)
      throw Error(b.request->status(), b.request->message());
  }
}

void GradientStream::saveResidual(void* out, size_t bytes) const {
  GS_CHECK(bytes == residual_.size(), Errc::kInvalidArgument,
           "residual is %zu bytes, not %zu (gs_stream_residual_bytes)", residual_.size(), bytes);
  for (const Bucket& b : buckets_) {
    GS_CHECK(b.request == nullptr || b.request->done(), Errc::kInvalidArgument,
             "gs_stream_save_residual while an iteration is running (call gs_stream_wait)");
  }
  if (bytes > 0)
    memcpy(out, residual_.data(), bytes);
}

void GradientStream::loadResidual(const void* in, size_t bytes) {
  GS_CHECK(bytes == residual_.size(), Errc::kInvalidArgument,
           "residual is %zu bytes, not %zu (gs_stream_residual_bytes)", residual_.size(), bytes);
  for (const Bucket& b : buckets_) {
    GS_CHECK(b.request == nullptr || b.request->done(), Errc::kInvalidArgument,
             "gs_stream_load_residual while an iteration is running");
  }
  if (bytes > 0)
    memcpy(residual_.data(), in, bytes);
}

}  // namespace gs::control
