#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "codecs/codec.h"
#include "control/communicator.h"

namespace gs::control {

struct GradientStreamConfig {
  size_t bucketBytes = 4 << 20;
  bool errorFeedback = false;
  std::string codec;  // empty: the communicator's
  /// CUDA: the stream producing the buffer (null: the legacy default stream; host buffers
  /// without a stream are used as they are). See Communicator::submit.
  CUstream_st* cudaStream = nullptr;
};

/// A gradient buffer reduced (allreduce, in place) bucket by bucket while the backward pass
/// still produces it: the caller marks ranges final with ready(), and every bucket whose
/// elements are all final is handed to the communicator's progress thread at once, so
/// communication overlaps compute.
///
/// Buckets are reduced in one fixed order on every rank (last bucket first, the order a
/// backward pass produces them), so ranks may mark ranges in different orders: a rank hands
/// bucket b over once b is complete here and every bucket before it in that order was handed
/// over. With error feedback each bucket's residual (what the lossy codec dropped last time)
/// is added before it is sent (by the communicator, see Communicator::run), and the engine
/// records the new residual.
///
/// CUDA: the buffer may be device memory. A bucket then reads what config.cudaStream's work
/// enqueued before the ready() call that handed it over, through pinned host staging; the
/// residual stays in host memory and is added to the staged values (DeviceStaging).
///
/// Not thread-safe: one thread drives an iteration (begin, ready..., wait). The buffer must
/// stay valid until close(). Owned by the caller; the communicator must outlive it.
class GradientStream {
 public:
  GradientStream(Communicator& comm,
                 void* buffer,
                 size_t count,
                 DataType dtype,
                 ReduceOp op,
                 const GradientStreamConfig& config);
  ~GradientStream();

  void begin();
  void ready(size_t offset, size_t count);
  /// Waits until every bucket is reduced; throws kTimeout when timeoutMs passes first (the
  /// iteration can be waited for again) or the collective's error.
  void wait(int64_t timeoutMs);
  /// Ends the iteration without blocking: fn runs once every bucket is reduced, with the first
  /// failure in reduction order (or kOk), on the thread that completes the last one (the
  /// progress thread) or at once here when all are done. Every element must have been marked
  /// ready. The next begin() may follow once fn ran.
  void onComplete(Request::Callback fn);

  size_t residualBytes() const { return residual_.size(); }
  void saveResidual(void* out, size_t bytes) const;
  void loadResidual(const void* in, size_t bytes);

 private:
  struct Bucket {
    size_t offset = 0, count = 0;
    size_t readyCount = 0;
    std::shared_ptr<Request> request;
  };
  void submitReady();
  void checkAllMarked(const char* call) const;
  void waitAll(Deadline deadline);

  Communicator& comm_;
  uint8_t* buffer_;
  size_t count_;
  DataType dtype_;
  ReduceOp op_;
  size_t elementSize_;
  std::unique_ptr<codecs::Codec> codec_;  // null: the communicator's
  bool errorFeedback_;
  CUstream_st* cudaStream_;
  std::vector<uint8_t> residual_;  // error feedback state, one element per element
  std::vector<Bucket> buckets_;    // in buffer order; reduced from the last one down
  size_t nextToSubmit_ = 0;        // index into the reduction order
  bool inIteration_ = false;
  std::map<size_t, size_t> marked_;  // ranges marked this iteration: offset -> end
};

}  // namespace gs::control
