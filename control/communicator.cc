// Running collectives on a communicator that connect() set up (communicator_connect.cc): one
// at a time in issue order, blocking or through the progress thread, host buffers directly and
// device buffers through staging, with the algorithm and codec chosen per call.

#include "control/communicator.h"

#include <algorithm>
#include <cstring>

#include "common/bytes.h"
#include "common/log.h"

namespace gs::control {

namespace {
// codec=auto: ranks agree on the chunk size every this many adaptive collectives.
constexpr uint64_t kChunkAgreementEvery = 8;
// How long the progress thread leaves a new point-to-point request to a thread that may be
// about to wait for it (Communicator::wait): messages are mostly posted as a group and waited
// for at once, and running them on that thread avoids two hand-offs. A request given a
// callback, tested or waited for briefly is not left (Communicator::hurry).
constexpr std::chrono::microseconds kWaiterGrace{30};
// After a message, the progress thread looks at the queue this often for this long instead of
// sleeping until woken: a loop of messages its issuing threads run themselves then costs no
// wake-up per message (a wake-up is a futex call for the issuer and a context switch on a core
// a peer rank may be using). A message nobody runs starts within one period.
constexpr std::chrono::microseconds kPollPeriod{1000};
constexpr std::chrono::milliseconds kPollAfterMessage{50};
}  // namespace

void Request::complete(Errc code, std::string message) {
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    status_ = code;
    message_ = std::move(message);
    done_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  // status_ and message_ no longer change once done_: read them without the lock.
  for (auto& fn : callbacks)
    runCallback(fn);
}

void Request::runCallback(const Callback& fn) const noexcept {
  try {
    fn(status_, message_);
  } catch (const std::exception& e) {
    GS_LOG_ERROR("a request's completion callback threw: %s", e.what());
  } catch (...) {
    GS_LOG_ERROR("a request's completion callback threw");
  }
}

void Request::onComplete(Callback fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  runCallback(fn);
}

bool Request::done() const {
  return done_.load(std::memory_order_acquire);
}

bool Request::waitUntil(Deadline deadline) const {
  if (done())
    return true;  // mostly: its waiter ran it (Communicator::wait)
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_until(lock, deadline.at(), [&] { return done_.load(std::memory_order_relaxed); });
}

Errc Request::status() const {
  if (done())
    return status_;  // final once done_ is set
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

std::string Request::message() const {
  if (done())
    return message_;
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

Communicator::Communicator(int nranks, int rank, const Config& config)
    : nranks_(nranks), rank_(rank), config_(config) {}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    stopping_ = true;
    updateGate();
  }
  queueCv_.notify_all();
  if (worker_.joinable())
    worker_.join();
  {
    // A thread waiting in wait() may still be running the last request it took.
    std::unique_lock<std::mutex> lock(queueMutex_);
    ++idleWaiters_;
    updateGate();
    queueCv_.wait(lock, [&] { return !queueRunning_; });
    --idleWaiters_;
    updateGate();
  }
  std::lock_guard<std::mutex> lock(execMutex_);
  bool healthy = !aborted_.load();
  {
    std::lock_guard<std::mutex> state(stateMutex_);
    healthy = healthy && !failure_;
  }
  if (engine_ && healthy)
    engine_->farewell(Deadline::afterMs(std::min<int64_t>(config_.timeoutMs, 10000)));
}

void Communicator::checkUsable() const {
  GS_CHECK(!aborted_.load(), Errc::kAborted, "communicator (rank %d) was aborted", rank_);
  if (!failed_.load(std::memory_order_acquire))
    return;
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (failure_) {
    throw Error(failure_->code(), std::string("communicator failed earlier: ") + failure_->what());
  }
}

void Communicator::execute(const stream::CollectiveArgs& args, bool record) {
  std::lock_guard<std::mutex> lock(execMutex_);
  checkUsable();
  try {
    stream::CollectiveArgs withCodec = args;
    // Integer buffers (and any dtype the codec cannot take) travel raw, exactly. A codec of the
    // call's own (a gradient stream's) stands.
    if (withCodec.codec == nullptr && codec_ && codec_->supports(args.dtype))
      withCodec.codec = codec_.get();
    // codec=auto: floating-point buffers with no codec of their own follow the controller.
    withCodec.adaptive = controller_ != nullptr && withCodec.codec == nullptr &&
                         codecs::residualElementSize(args.dtype) > 0;
    if (withCodec.adaptive && ++adaptiveCalls_ % kChunkAgreementEvery == 0)
      agreeOnChunkSize();
    if (withCodec.adaptive)
      controller_->begin(*metrics_);
    if (args.kind == stream::CollectiveKind::kAllReduce)
      withCodec.algorithm = chooseAlgorithm(withCodec);
    if (args.kind == stream::CollectiveKind::kReduce) {
      withCodec.reduceAlgorithm = chooseReduce(withCodec);
      if (withCodec.reduceAlgorithm == stream::ReduceAlgorithm::kTree && rank_ != args.root) {
        reduceScratch_.resize(args.count * elementSize(args.dtype));
        withCodec.recv = reduceScratch_.data();
      }
    }
    metrics_->beginCollective();
    engine_->run(withCodec);
    if (args.kind == stream::CollectiveKind::kAllReduce)
      tuner_.record(static_cast<int64_t>(engine_->lastStats().elapsedNs));
    if (engine_->lastStats().adaptive) {
      std::vector<stream::Link*> byPeer(links_.size(), nullptr);
      for (size_t p = 0; p < links_.size(); ++p)
        byPeer[p] = links_[p].get();
      controller_->end(*engine_, *metrics_, byPeer, AdaptiveController::Clock::now());
    }
    if (record)
      recordCollective(args, static_cast<double>(engine_->lastStats().elapsedNs) * 1e-9);
  } catch (const Error& e) {
    fail(e);
    throw;
  }
}

void Communicator::fail(const Error& e) {
  {
    std::lock_guard<std::mutex> state(stateMutex_);
    if (failure_)
      return;  // already counted (a staged call's piece failed in execute)
    failure_ = e;
    failed_.store(true, std::memory_order_release);
  }
  metrics_->recordError(e.code());
}

void Communicator::setDeviceMemory(std::shared_ptr<codecs::DeviceMemory> memory) {
  std::lock_guard<std::mutex> lock(deviceMemoryMutex_);
  deviceMemory_ = std::move(memory);
  deviceMemoryResolved_ = true;
  deviceMemoryKnownPtr_ = deviceMemory_.get();
  deviceMemoryKnown_.store(true, std::memory_order_release);
}

codecs::DeviceMemory* Communicator::deviceMemory() {
  if (deviceMemoryKnown_.load(std::memory_order_acquire))
    return deviceMemoryKnownPtr_;
  std::lock_guard<std::mutex> lock(deviceMemoryMutex_);
  if (!deviceMemoryResolved_) {
    deviceMemoryResolved_ = true;
    try {
      deviceMemory_ = codecs::makeCudaDeviceMemory();
    } catch (const Error& e) {
      deviceMemoryUnavailable_ = e.what();
    }
  }
  deviceMemoryKnownPtr_ = deviceMemory_.get();
  deviceMemoryKnown_.store(true, std::memory_order_release);
  return deviceMemoryKnownPtr_;
}

void Communicator::checkStreamUsable(const codecs::DeviceMemory* memory) const {
  GS_CHECK(memory != nullptr, Errc::kUnsupported, "cuda_stream is not NULL, but %s",
           deviceMemoryUnavailable_.c_str());
}

int Communicator::bufferDevice(const void* p) {
  codecs::DeviceMemory* memory = deviceMemory();
  return memory != nullptr ? memory->deviceOf(p) : -1;
}

void Communicator::runStaged(const stream::CollectiveArgs& args,
                             CUstream_st* cudaStream,
                             const StreamMark* issued) {
  codecs::DeviceMemory* memory = deviceMemory();
  const int device = memory != nullptr ? collectiveDevice(*memory, args) : -1;
  if (device < 0 && cudaStream == nullptr && issued == nullptr)
    return runHost(args);
  checkStreamUsable(memory);
  if (!staging_) {
    staging_ = std::make_unique<DeviceStaging>(deviceMemory_, config_.stagingBytes,
                                               config_.timeoutMs, aborted_);
  }
  try {
    if (device < 0) {
      // Host buffers: after the stream's producers (those enqueued before this call, or before
      // the request was issued).
      if (issued == nullptr)
        staging_->waitFor(StreamMark(deviceMemory_, cudaStream, -1));
      else
        staging_->waitFor(*issued);
      return runHost(args);
    }
    if (!stagingLogged_) {
      stagingLogged_ = true;
      GS_LOG_INFO(
          "rank %d: CUDA device buffers (device %d) go through pinned host staging: 2 x %lld "
          "bytes, copies on %s stream, reduction on the host over %s%s",
          rank_, device, static_cast<long long>(config_.stagingBytes),
          issued != nullptr ? "the communicator's own" : "the caller's", transportName_.c_str(),
          networkTransport_ == "verbs" ? " (the NIC does not touch GPU memory in this version)"
                                       : "");
    }
    const auto start = Clock::now();
    auto runHost = [&](const stream::CollectiveArgs& piece) { execute(piece, false); };
    const DeviceStaging::Totals totals =
        issued != nullptr ? staging_->runIssued(args, rank_, nranks_, *issued, runHost)
                          : staging_->run(args, rank_, nranks_, device, cudaStream, runHost);
    metrics_->recordStaged(totals.toHostBytes, totals.toDeviceBytes);
    recordCollective(args, std::chrono::duration<double>(Clock::now() - start).count());
  } catch (const Error& e) {
    // The peers are in (or about to enter) this collective: a rank that cannot take part
    // leaves the communicator broken, as a failed engine run does. A bad argument (a stream of
    // another device) is refused before anything was staged, as the C API's checks are.
    if (e.code() != Errc::kInvalidArgument) {
      fail(e);
      std::lock_guard<std::mutex> lock(execMutex_);
      engine_->notifyPeers(e.code(), e.what());  // once per engine: a no-op after a run did
    }
    throw;
  }
}

void Communicator::runHost(const stream::CollectiveArgs& args) {
  if (args.residual != nullptr) {
    GS_CHECK(args.kind == stream::CollectiveKind::kAllReduce && args.send == args.recv,
             Errc::kInvalidArgument, "error feedback (a residual) needs an in-place allreduce");
    const size_t rsize = codecs::residualElementSize(args.dtype);
    codecs::applyResidual(args.dtype, args.recv, args.residual, args.count);
    memset(args.residual, 0, args.count * rsize);
  }
  execute(args);
}

void Communicator::agreeOnChunkSize() {
  // Proposals above the slot size (or none yet) count as the slot size: chunks cannot grow
  // beyond what a receive slot holds.
  const int64_t slot = config_.chunkBytes;
  const int64_t proposal = controller_->proposedChunkBytes();
  std::vector<int64_t> value{proposal > 0 ? std::min(proposal, slot) : slot};
  agreeInternally(value, ReduceOp::kMin);
  const int64_t agreed = std::max<int64_t>(value[0], 4096);
  if (agreed != engine_->chunkBytes()) {
    GS_LOG_INFO("rank %d: chunk size %lld -> %lld bytes (agreed by all ranks)", rank_,
                static_cast<long long>(engine_->chunkBytes()), static_cast<long long>(agreed));
    engine_->setChunkBytes(agreed);
  }
}

void Communicator::agreeInternally(std::vector<int64_t>& values, ReduceOp op) {
  stream::CollectiveArgs a;
  a.kind = stream::CollectiveKind::kAllReduce;
  a.send = values.data();
  a.recv = values.data();
  a.count = values.size();
  a.dtype = DataType::kInt64;
  a.op = op;
  engine_->run(a);
}

bool Communicator::tuneHere() {
  if (!tuneHere_)
    tuneHere_ = config_.algoTune == "always" || (config_.algoTune == "crowded" && crowdedHost());
  return *tuneHere_;
}

bool Communicator::crowdedHost() const {
  // Some host's ranks outnumber its cores: where the model's crowded terms are least sure
  // (docs/PERFORMANCE.md §4, §10), over the network and over shared memory alike. Decided from
  // every rank's records (topology_), so every rank decides alike.
  for (int h = 0; h < topology_.hosts(); ++h) {
    const int cores = topology_.coresOn(h);
    if (cores > 0 && static_cast<int>(topology_.ranksOn(h).size()) > cores)
      return true;
  }
  return false;
}

std::optional<Communicator::TunedChoice> Communicator::tunedAlgorithm(
    const stream::CollectiveArgs& args, const PricedAlgorithms& priced) {
  const size_t callBytes = args.count * elementSize(args.dtype);
  // codec=auto's rungs differ per rank (see chooseAlgorithm); small calls: AlgorithmTuner.
  if (args.adaptive || callBytes < AlgorithmTuner::kMinBytes || !tuneHere())
    return std::nullopt;
  const AlgorithmTuner::Key key{callBytes, args.codec};
  if (auto done = tuner_.decided(key))
    return TunedChoice{*done, false};
  if (!tuner_.inTrial(key)) {
    std::vector<stream::Algorithm> candidates;
    for (const auto& [seconds, algorithm] : priced) {
      if (candidates.size() < AlgorithmTuner::kMaxCandidates &&
          seconds <= priced.front().first * AlgorithmTuner::kCandidateFactor)
        candidates.push_back(algorithm);
    }
    if (candidates.size() < 2)
      return std::nullopt;  // the model is sure
    tuner_.begin(key, std::move(candidates));
  }
  if (!tuner_.trialsDone(key))
    return TunedChoice{tuner_.nextTrial(key), true};
  // Every rank reaches this call of this size after the same trials: agree, then decide alike.
  std::vector<int64_t> words = tuner_.agreementVector(key);
  agreeInternally(words, ReduceOp::kMax);
  const AlgorithmTuner::Decision d = tuner_.decide(key, words);
  if (!d.consistent) {
    GS_LOG_WARN(
        "rank %d: ranks tried different schedules for an allreduce of %zu bytes "
        "(settings differ?); all run %s",
        rank_, callBytes, stream::algorithmName(d.algorithm));
  }
  GS_LOG_INFO(
      "allreduce of %zu bytes on %d ranks: measured %s (slowest rank, median of %d); "
      "runs %s (cost model: %s)",
      callBytes, nranks_, describeTrials(d).c_str(), AlgorithmTuner::kMeasuredCalls,
      stream::algorithmName(d.algorithm), stream::algorithmName(priced.front().second));
  return TunedChoice{d.algorithm, false};
}

stream::Algorithm Communicator::chooseAlgorithm(const stream::CollectiveArgs& args) {
  // Error feedback's accounting is the ring's (see CollectiveArgs::residual).
  if (args.residual != nullptr || algorithms_.size() == 1)
    return args.residual != nullptr ? stream::Algorithm::kRing : algorithms_.front();
  const size_t callBytes = args.count * elementSize(args.dtype);
  for (const AlgorithmChoice& c : choices_) {
    if (c.bytes == callBytes && c.codec == args.codec && c.adaptive == args.adaptive)
      return c.algorithm;
  }
  stream::CostModel model = costModel_;
  // The call's codec, which may be a gradient stream's over a raw communicator.
  model.codecRatio = wireRatio(args.codec);
  const double bytes = static_cast<double>(callBytes);
  PricedAlgorithms priced;
  for (stream::Algorithm a : algorithms_) {
    // codec=auto compresses because the network is the bottleneck, and only the ring and the
    // tree carry a codec on every hop (halving-doubling's doubling and hierarchical's host
    // steps travel raw). The rungs in use differ per rank, so they cannot enter a choice that
    // every rank must make alike; args.adaptive is the same everywhere.
    if (args.adaptive && a != stream::Algorithm::kRing && a != stream::Algorithm::kTree)
      continue;
    priced.emplace_back(stream::predictAllReduceSeconds(a, topology_, bytes, model), a);
  }
  if (priced.empty())
    return stream::Algorithm::kRing;
  // Cheapest first; ties keep kAlgorithms' order.
  std::stable_sort(priced.begin(), priced.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  stream::Algorithm best = priced.front().second;
  double bestTime = priced.front().first;
  if (const auto tuned = tunedAlgorithm(args, priced)) {
    if (tuned->trial)
      return tuned->algorithm;  // not remembered: the next call of the size tries the next
    best = tuned->algorithm;
    for (const auto& [seconds, algorithm] : priced) {
      if (algorithm == best)
        bestTime = seconds;
    }
  }
  if (best != lastChoice_) {
    GS_LOG_INFO("allreduce of %.0f bytes on %d ranks (%d hosts): algorithm %s (predicted %.1f us)",
                bytes, nranks_, topology_.hosts(), stream::algorithmName(best), bestTime * 1e6);
    lastChoice_ = best;
  }
  choices_[nextChoice_] = AlgorithmChoice{callBytes, args.codec, args.adaptive, best};
  nextChoice_ = (nextChoice_ + 1) % kRememberedChoices;
  return best;
}

stream::ReduceAlgorithm Communicator::chooseReduce(const stream::CollectiveArgs& args) {
  stream::CostModel model = costModel_;
  if (args.codec == nullptr)
    model.codecRatio = 1.0;
  const double bytes = static_cast<double>(args.count * elementSize(args.dtype));
  const stream::ReduceAlgorithm best =
      fixedReduce_ ? *fixedReduce_ : stream::cheapestReduce(topology_, bytes, model);
  if (!reduceChosen_ || best != lastReduceChoice_) {
    GS_LOG_INFO("reduce of %.0f bytes on %d ranks (%d hosts): algorithm %s (predicted %.1f us)",
                bytes, nranks_, topology_.hosts(), stream::reduceAlgorithmName(best),
                stream::predictReduceSeconds(best, topology_, bytes, model) * 1e6);
    lastReduceChoice_ = best;
    reduceChosen_ = true;
  }
  return best;
}

// nccl-tests conventions: size is the larger buffer; busbw scales algbw by the data each link
// must carry in an optimal algorithm.
void Communicator::recordCollective(const stream::CollectiveArgs& args, double seconds) {
  const double n = nranks_;
  double bytes = static_cast<double>(args.count * elementSize(args.dtype)), factor = 1;
  switch (args.kind) {
    case stream::CollectiveKind::kAllReduce:
      factor = 2 * (n - 1) / n;
      break;
    case stream::CollectiveKind::kReduceScatter:
    case stream::CollectiveKind::kAllGather:
      bytes *= n;
      factor = (n - 1) / n;
      break;
    case stream::CollectiveKind::kBroadcast:
    case stream::CollectiveKind::kReduce:
    case stream::CollectiveKind::kPointToPoint:  // count: the elements of the batch's messages
      break;
    case stream::CollectiveKind::kAllToAll:
      // The larger of what this rank sends and receives; (n-1)/n of it crosses a link.
      bytes =
          static_cast<double>(args.layout != nullptr
                                  ? std::max(args.layout->sendExtent(), args.layout->recvExtent())
                                  : args.count * static_cast<size_t>(nranks_)) *
          static_cast<double>(elementSize(args.dtype));
      factor = (n - 1) / n;
      break;
  }
  const double algbw = seconds > 0 ? bytes / seconds : 0;
  metrics_->recordCollective(static_cast<monitoring::CollectiveOp>(args.kind),
                             engine_->lastAlgorithm(), seconds, static_cast<uint64_t>(bytes), algbw,
                             algbw * factor);
  metrics_->setBufferRegistrations(engine_->bufferRegistrations(),
                                   engine_->bufferRegisteredBytes());
  last_.store({seconds, algbw, algbw * factor, engine_->lastAlgorithm()});
}

Communicator::Stats Communicator::stats() const {
  Stats out;
  out.snapshot = metrics_->snapshot();
  out.metricsAddress = metrics_->exporterAddress();
  const LastCollective::Value last = last_.load();
  out.lastSeconds = last.seconds;
  out.lastAlgbw = last.algbw;
  out.lastBusbw = last.busbw;
  out.lastAlgorithm = last.algorithm != nullptr ? last.algorithm : "";
  return out;
}

void Communicator::run(const stream::CollectiveArgs& args, CUstream_st* cudaStream) {
  checkUsable();
  if (args.kind == stream::CollectiveKind::kPointToPoint) {
    runMessage(args, cudaStream);
    return;
  }
  // Nothing queued, running or waiting: the gate in one compare-and-swap.
  uint32_t idle = 0;
  if (gate_.compare_exchange_strong(idle, kGateFast, std::memory_order_acquire)) {
    struct FastRelease {
      Communicator* self;
      ~FastRelease() { self->leaveFastGate(); }
    } release{this};
    runStaged(args, cudaStream);
    return;
  }
  std::unique_lock<std::mutex> lock(queueMutex_);
  // Earlier non-blocking requests go first (issue order). Each is bounded by the timeout.
  ++idleWaiters_;
  updateGate();  // before looking at kGateFast: a fast call leaving now then wakes this one
  queueCv_.wait(lock,
                [&] { return (queue_.empty() && !queueRunning_ && !inlineBusy()) || stopping_; });
  --idleWaiters_;
  inlineBusy_ = true;
  updateGate();
  lock.unlock();
  struct Release {
    Communicator* self;
    ~Release() {
      bool wake;
      {
        std::lock_guard<std::mutex> l(self->queueMutex_);
        self->inlineBusy_ = false;
        self->updateGate();
        // Only those waiting for this call to end need it: queued work (the progress thread
        // runs it now) and other blocking calls. A progress thread with nothing queued sleeps
        // on: woken after every blocking call, it took the core from a peer rank once per call
        // (2 ranks, 64 B isend / irecv after a blocking barrier: a context switch each).
        wake = !self->queue_.empty() || self->idleWaiters_ > 0 || self->stopping_;
      }
      if (wake)
        self->queueCv_.notify_all();
    }
  } release{this};
  runStaged(args, cudaStream);
}

void Communicator::updateGate() {
  const bool active =
      !queue_.empty() || queueRunning_ || inlineBusy_ || idleWaiters_ > 0 || stopping_;
  // Only this function, under queueMutex_, writes kGateSlow: the bit read is the last written.
  const bool marked = (gate_.load(std::memory_order_relaxed) & kGateSlow) != 0;
  if (active && !marked)
    gate_.fetch_or(kGateSlow);
  else if (!active && marked)
    gate_.fetch_and(~kGateSlow);
}

bool Communicator::inlineBusy() const {
  return inlineBusy_ || (gate_.load() & kGateFast) != 0;
}

void Communicator::leaveFastGate() {
  uint32_t held = kGateFast;
  if (gate_.compare_exchange_strong(held, 0, std::memory_order_release))
    return;
  // Something was queued or began to wait meanwhile (kGateSlow): it waits for this call.
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    gate_.fetch_and(~kGateFast);
  }
  queueCv_.notify_all();
}

std::shared_ptr<Request> Communicator::submit(const stream::CollectiveArgs& args,
                                              CUstream_st* cudaStream) {
  checkUsable();
  std::unique_ptr<StreamMark> issued;
  codecs::DeviceMemory* memory = deviceMemory();
  const int device = memory != nullptr ? collectiveDevice(*memory, args) : -1;
  if (device >= 0 || cudaStream != nullptr) {
    checkStreamUsable(memory);
    issued = std::make_unique<StreamMark>(deviceMemory_, cudaStream, device);
  }
  auto request = std::make_shared<Request>(args, std::move(issued));
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    if (!worker_.joinable())
      worker_ = std::thread([this] { progressLoop(); });
    // Behind another request the progress thread already knows there is work (whoever clears
    // a flag it waits on notifies); a polling one finds a message by itself.
    wake = queue_.empty() && !(request->isMessage() && workerPolling_);
    if (request->isMessage())
      lastMessage_ = request->created();
    queue_.push_back(request);
    queueLength_.store(queue_.size(), std::memory_order_relaxed);
    updateGate();
  }
  if (wake)
    queueCv_.notify_all();
  return request;
}

void Communicator::hurry(const std::shared_ptr<Request>& request) {
  if (request->done() || !request->isMessage())
    return;  // other requests never wait for a waiter
  request->hurry();
  std::lock_guard<std::mutex> lock(queueMutex_);
  if (std::find(queue_.begin(), queue_.end(), request) != queue_.end())
    queueCv_.notify_all();
}

bool Communicator::wait(const std::shared_ptr<Request>& request, Deadline deadline, bool mayRun) {
  if (request->done())
    return true;
  std::unique_lock<std::mutex> lock(queueMutex_);
  while (mayRun && !queueRunning_ && !inlineBusy() && !request->done() &&
         std::find(queue_.begin(), queue_.end(), request) != queue_.end()) {
    runFront(lock, request.get());
  }
  lock.unlock();
  return request->waitUntil(deadline);
}

void Communicator::runFront(std::unique_lock<std::mutex>& lock, const Request* waiter) {
  auto request = queue_.front();
  queue_.pop_front();
  queueLength_.store(queue_.size(), std::memory_order_relaxed);
  queueRunning_ = true;
  updateGate();
  lock.unlock();
  runQueued(request, waiter);
  lock.lock();
  queueRunning_ = false;
  updateGate();
  // Only those waiting for the queue need this: the progress thread when work is left for it,
  // blocking calls and the destructor. A progress thread in its grace wait wakes by itself (not
  // woken here, it does not steal the core a waiter's peer may need).
  if (!queue_.empty() || idleWaiters_ > 0 || stopping_)
    queueCv_.notify_all();
}

void Communicator::runQueued(const std::shared_ptr<Request>& request, const Request* waiter) {
  if (request->isMessage()) {
    runMessages(request, waiter);  // completes each request itself
    return;
  }
  try {
    runStaged(request->args(), nullptr, request->issued());
    request->complete(Errc::kOk, "");
  } catch (const Error& e) {
    request->complete(e.code(), e.what());
  } catch (const std::exception& e) {
    request->complete(Errc::kInternal, e.what());
  }
}

void Communicator::progressLoop() {
  setLogRank(rank_);
  std::unique_lock<std::mutex> lock(queueMutex_);
  for (;;) {
    const auto now = Clock::now();
    if (queue_.empty() || inlineBusy() || queueRunning_) {
      if (stopping_ && queue_.empty() && !queueRunning_)
        return;
      if (queue_.empty() && now < lastMessage_ + kPollAfterMessage) {
        workerPolling_ = true;
        queueCv_.wait_until(lock, now + kPollPeriod);
        workerPolling_ = false;
      } else {
        queueCv_.wait(lock);
      }
      continue;
    }
    const Request& front = *queue_.front();
    const auto due = front.created() + kWaiterGrace;
    if (front.isMessage() && !front.hurried() && !stopping_ && now < due) {
      workerPolling_ = true;  // a waiter may take it meanwhile
      queueCv_.wait_until(lock, due);
      workerPolling_ = false;
      continue;
    }
    runFront(lock, nullptr);
  }
}

void Communicator::abort() {
  aborted_.store(true);
  if (device_)
    device_->interrupt();
  if (shmDevice_)
    shmDevice_->interrupt();
  // When no collective is running, tell the peers here; otherwise the running one does.
  std::unique_lock<std::mutex> lock(execMutex_, std::try_to_lock);
  if (lock.owns_lock() && engine_)
    engine_->notifyPeers(Errc::kAborted, "communicator aborted");
  GS_LOG_WARN("communicator rank %d of %d aborted", rank_, nranks_);
}

}  // namespace gs::control
