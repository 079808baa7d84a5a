// Point-to-point messages on a communicator (gs_send / gs_recv / gs_isend / gs_irecv): they
// share the request queue with the collectives, so everything completes in issue order, and
// the progress thread runs a series of consecutive messages as one engine run that messages
// posted later join (both ends of an exchange may post their sends first). Messages on device
// buffers go through the communicator's pinned pool (control/message_staging.h): a send is
// copied to pinned memory when it joins the run, a receive copied to the device when it is
// complete.
#include <chrono>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "control/communicator.h"

namespace gs::control {

namespace {
stream::PointToPointOp opOf(const stream::CollectiveArgs& a) {
  stream::PointToPointOp op;
  op.send = a.sending;
  op.peer = a.peer;
  op.buffer = a.sending ? const_cast<void*>(a.send) : a.recv;
  op.count = a.count;
  op.dtype = a.dtype;
  return op;
}

}  // namespace

void Communicator::runMessage(const stream::CollectiveArgs& args, CUstream_st* cudaStream) {
  auto request = submit(args, cudaStream);
  // The engine bounds the wait (the timeout, a peer's failure); this thread usually runs the
  // message itself (wait()).
  while (!wait(request, Deadline::afterMs(60'000))) {
  }
  if (request->status() != Errc::kOk)
    throw Error(request->status(), request->message());
}

MessageStaging& Communicator::messageStaging() {
  if (!messageStaging_) {
    // The collectives' pinned budget (two slots) stays pooled between runs.
    messageStaging_ = std::make_unique<MessageStaging>(deviceMemory_, 2 * config_.stagingBytes,
                                                       config_.timeoutMs, aborted_);
  }
  return *messageStaging_;
}

stream::PointToPointOp Communicator::admitMessage(const std::shared_ptr<Request>& request) {
  runBatch_.push_back(request);
  runPinned_.push_back(nullptr);
  stream::PointToPointOp op = opOf(request->args());
  const StreamMark* issued = request->issued();
  if (issued == nullptr)
    return op;
  const size_t size = op.count * elementSize(op.dtype);
  const std::string what =
      formatString("the %s of %zu bytes %s rank %d (%s)", op.send ? "send" : "receive", size,
                   op.send ? "to" : "from", op.peer, op.send ? "sendbuff" : "recvbuff");
  MessageStaging& staging = messageStaging();
  if (size == 0 || deviceMemory_->deviceOf(op.buffer) < 0) {
    staging.waitFor(*issued, what.c_str());
    return op;
  }
  void* host = staging.acquire(size);
  runPinned_.back() = host;
  if (op.send)
    staging.copy(host, op.buffer, size, *issued, what.c_str());
  op.buffer = host;
  return op;
}

void Communicator::takeQueuedMessages(std::vector<stream::PointToPointOp>& out) {
  runTaken_.clear();
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    while (!queue_.empty() && queue_.front()->isMessage()) {
      runTaken_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    queueLength_.store(queue_.size(), std::memory_order_relaxed);
    updateGate();
  }
  // Staged outside the queue lock (a device send waits for its copy). Taken requests are in
  // the batch at once: a failure completes them too.
  for (size_t i = 0; i < runTaken_.size(); ++i) {
    try {
      out.push_back(admitMessage(runTaken_[i]));
    } catch (...) {
      for (size_t j = i + 1; j < runTaken_.size(); ++j) {
        runBatch_.push_back(runTaken_[j]);
        runPinned_.push_back(nullptr);
      }
      runTaken_.clear();
      throw;
    }
  }
  runTaken_.clear();
}

void Communicator::runMessages(const std::shared_ptr<Request>& first, const Request* waiter) {
  // What the feed's functions need, behind one pointer: std::function keeps a capture of that
  // size in place instead of allocating it per run.
  struct State {
    Communicator& self;
    const Request* waiter;
    // The messages queued behind the first when the run starts join it even if the waiter's
    // own request is done by then: its caller almost always waits for them next (isend +
    // irecv + wait + wait), and a small send may complete at once on its receiver's notice,
    // before the receive posted after it was taken; left in the queue, the progress thread
    // took that receive and every wait became a hand-off (4 ranks on 2 cores, 8 B sendrecv:
    // 6 -> 23-34 us).
    bool swept = false;
    size_t completed = 0;
    uint64_t bytes = 0;
  } state{*this, waiter};
  struct Reset {  // the batch's requests are released whatever happens
    Communicator& self;
    ~Reset() {
      self.runBatch_.clear();
      self.runPinned_.clear();
      self.runFirst_.clear();
    }
  } reset{*this};
  runBatch_.clear();
  runPinned_.clear();
  stream::PointToPointFeed feed;
  feed.more = [st = &state](std::vector<stream::PointToPointOp>& out) {
    if (st->waiter != nullptr && st->waiter->done() && st->swept)
      return;  // the waiting thread goes back to its caller; the progress thread goes on
    // Nothing queued (a stale answer only defers a new message to the next idle round).
    if (st->swept && st->self.queueLength_.load(std::memory_order_relaxed) == 0)
      return;
    st->swept = true;
    st->self.takeQueuedMessages(out);
  };
  feed.completed = [st = &state](size_t index) {
    Communicator& self = st->self;
    const auto& a = self.runBatch_[index]->args();
    const size_t size = a.count * elementSize(a.dtype);
    if (self.runPinned_[index] != nullptr) {
      MessageStaging& staging = self.messageStaging();
      if (!a.sending) {
        const std::string what =
            formatString("the receive of %zu bytes from rank %d (recvbuff)", size, a.peer);
        staging.copy(a.recv, self.runPinned_[index], size, *self.runBatch_[index]->issued(),
                     what.c_str());
      }
      staging.release(self.runPinned_[index]);
      self.runPinned_[index] = nullptr;
      // Counted before the request completes: its caller may read gs_comm_stats at once.
      self.metrics_->recordStaged(a.sending ? size : 0, a.sending ? 0 : size);
    }
    st->bytes += size;
    st->completed = index + 1;
    self.runBatch_[index]->complete(Errc::kOk, "");
  };
  try {
    std::lock_guard<std::mutex> lock(execMutex_);
    struct Trim {  // the engine's run (and its registrations) is over by then
      Communicator* self;
      ~Trim() {
        if (!self->messageStaging_)
          return;
        for (void* p : self->runPinned_) {
          if (p != nullptr)
            self->messageStaging_->release(p);
        }
        self->messageStaging_->trim();
      }
    } trim{this};
    checkUsable();
    try {
      stream::CollectiveArgs base;
      base.kind = stream::CollectiveKind::kPointToPoint;
      // Floats the codec supports travel encoded (engine: per message); codec=auto follows the
      // controller's rung per link, as the collectives left it.
      base.codec = codec_.get();
      base.adaptive = controller_ != nullptr;
      // What is queued behind the first joins from the start: its posts then leave in the
      // run's first round with the first's (over tcp: a sendrecv's data and receive notice in
      // one write), not a round later.
      runFirst_.clear();
      runFirst_.push_back(admitMessage(first));
      feed.more(runFirst_);
      metrics_->beginCollective();
      engine_->runPointToPoint(base, runFirst_, feed);
      stream::CollectiveArgs summary;
      summary.kind = stream::CollectiveKind::kPointToPoint;
      summary.dtype = DataType::kUInt8;
      summary.count = state.bytes;
      recordCollective(summary, static_cast<double>(engine_->lastStats().elapsedNs) * 1e-9);
    } catch (const Error& e) {
      fail(e);
      // A rank whose staging failed would leave its peers waiting for its messages.
      engine_->notifyPeers(e.code(), e.what());  // a no-op after the engine's run did
      throw;
    }
  } catch (const Error& e) {
    completeRest(first, state.completed, e.code(), e.what());
  } catch (const std::exception& e) {
    completeRest(first, state.completed, Errc::kInternal, e.what());
  }
}

void Communicator::completeRest(const std::shared_ptr<Request>& first,
                                size_t completed,
                                Errc code,
                                const char* message) {
  if (runBatch_.empty())
    runBatch_.push_back(first);
  for (size_t i = completed; i < runBatch_.size(); ++i)
    runBatch_[i]->complete(code, message);
}

}  // namespace gs::control
