// Point-to-point messages (gs_send / gs_recv): Engine::runPointToPoint and the MessageRun it
// drives. A run is an Engine::Run like a collective's, over a plan that grows: each message's
// chunks go at the end of its link's queues (appendMessage), messages posted while others are
// in flight join the run, and each is reported done on its own, in order.
#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "stream/engine_run.h"

namespace gs::stream {
namespace {

// Idle rounds MessageRun::runBoxed spins before it leaves the wait to the progress loop, which
// reads the peers' notices, yields the core and keeps the deadline: a few microseconds, about
// what the loop spins before it yields.
constexpr uint32_t kBoxedIdleRounds = 256;

}  // namespace

void Engine::MessageRunLists::clear() {
  regions.clear();  // the registrations end with the run
  for (Run::LinkRun& lr : links) {
    lr.sendDone.clear();
    spareSendDone.push_back(std::move(lr.sendDone));
  }
  links.clear();
  list.clear();
  plan.deps.clear();
  plan.messages.clear();
  for (Plan::LinkQueues& q : plan.links) {
    q.sends.clear();
    q.recvs.clear();
  }
  for (std::vector<size_t>& sends : sendsOf)
    sends.clear();
  sendsDone.clear();
  incoming.clear();
}

void Engine::MessageRun::begin(const CollectiveArgs& b, const PointToPointFeed& f) {
  base = &b;
  feed = &f;
  queuesUsed = reported = announceFrom = chunked = 0;
  owesCredits = boxTrouble = false;
  idleRounds = 0;
  const auto nranks = static_cast<size_t>(engine.nranks_);
  linkOf.assign(nranks, -1);
  // Never reallocated while the run runs: LinkRun::queues points into plan.links.
  plan.links.reserve(nranks);
  links.reserve(nranks);
  if (engine.messagesSent_.size() < nranks) {
    engine.messagesSent_.resize(nranks, 0);
    engine.messagesReceived_.resize(nranks, 0);
  }
}

// Integers, and floats the codec cannot encode, travel in their dtype (as for collectives).
bool Engine::MessageRun::travelsRaw(const Run::LinkRun& lr, DataType dtype) {
  return lr.codec == nullptr || !lr.codec->supports(dtype);
}

size_t Engine::MessageRun::linkFor(int peer) {
  if (linkOf[peer] >= 0)
    return static_cast<size_t>(linkOf[peer]);
  Link* link = engine.links_[peer];
  GS_CHECK(link != nullptr && link->connected(), Errc::kInternal,
           "no connection to rank %d for a message", peer);
  if (queuesUsed == plan.links.size())
    plan.links.push_back({peer, {}, {}});
  Plan::LinkQueues& queues = plan.links[queuesUsed++];
  queues.peer = peer;
  Run::LinkRun lr;
  lr.link = link;
  lr.queues = &queues;
  if (!spareSendDone.empty()) {
    lr.sendDone = std::move(spareSendDone.back());
    spareSendDone.pop_back();
  }
  if (static_cast<size_t>(peer) < engine.counters_.size())
    lr.counters = engine.counters_[peer];
  // Joins now: its chunks start where the link's sequences stand (nothing else uses the link
  // while this run holds the engine).
  lr.sendBase = link->sendSequence;
  lr.recvBase = link->recvSequence;
  lr.codec = base->adaptive && static_cast<size_t>(peer) < engine.linkCodecs_.size()
                 ? engine.linkCodecs_[peer]
                 : base->codec;
  if (lr.codec != nullptr)
    link->ensureEncodeStaging();
  links.push_back(std::move(lr));
  const size_t li = links.size() - 1;
  linkOf[peer] = static_cast<int>(li);
  if (sendsOf.size() <= li)
    sendsOf.emplace_back();
  sendsDone.push_back(0);
  return li;
}

void Engine::MessageRun::admit(const std::vector<PointToPointOp>& ops) {
  // Peers no schedule linked: link them first, all at once (the maker connects pairwise; the
  // peer makes its end at its first message to this rank).
  std::vector<int> missing;
  for (const PointToPointOp& op : ops) {
    GS_CHECK(op.peer >= 0 && op.peer < engine.nranks_ && op.peer != engine.rank_, Errc::kInternal,
             "a message to or from rank %d (of %d; this is rank %d)", op.peer, engine.nranks_,
             engine.rank_);
    if (engine.links_[op.peer] == nullptr &&
        std::find(missing.begin(), missing.end(), op.peer) == missing.end()) {
      missing.push_back(op.peer);
    }
  }
  if (!missing.empty()) {
    GS_CHECK(engine.linkMaker_, Errc::kInternal, "no connection to rank %d for a message",
             missing.front());
    std::sort(missing.begin(), missing.end());
    engine.linkMaker_(missing);
  }
  for (const PointToPointOp& op : ops) {
    const size_t li = linkFor(op.peer);
    Run::LinkRun& lr = links[li];
    const size_t esize = elementSize(op.dtype);
    MessageInput m;
    m.send = op.send;
    m.buffer = static_cast<uint8_t*>(op.buffer);
    m.count = op.count;
    m.dtype = op.dtype;
    m.id = op.send ? engine.messagesSent_[op.peer]++ : engine.messagesReceived_[op.peer]++;
    if (travelsInBox(lr, op)) {
      Message boxed{li, op.send, 0, m.id, m.count, m.dtype};
      boxed.boxed = true;
      boxed.buffer = op.buffer;
      boxed.box = op.send ? ++lr.link->boxesPosted : ++lr.link->boxesReceived;
      list.push_back(boxed);
      if (op.send)
        sendsOf[li].push_back(list.size() - 1);
      continue;
    }
    m.chunkElements = std::max<size_t>(1, static_cast<size_t>(engine.chunkBytes_) / esize);
    m.raw = travelsRaw(lr, op.dtype);
    if (op.send && op.count > 0) {
      // Registered with the device that carries the link (shm or the network one).
      regions.push_back(lr.link->device().registerMemory(op.buffer, op.count * esize));
      m.region = regions.back().get();
    }
    appendMessage(plan, *lr.queues, m);
    ++chunked;
    lr.sendDone.resize(lr.queues->sends.size(), 0);
    list.push_back({li, op.send, op.send ? lr.queues->sends.size() : lr.queues->recvs.size(), m.id,
                    m.count, m.dtype});
    if (op.send)
      sendsOf[li].push_back(list.size() - 1);
  }
}

void Engine::MessageRun::announceReceives() {
  for (; announceFrom < list.size(); ++announceFrom) {
    Message& m = list[announceFrom];
    if (m.send || m.boxed)  // a boxed receive only once it waits (announceWaitingBoxes)
      continue;
    m.announced = announceReceive(m);
    // Its sender waits for the credits: this run returns them as they free, from now on (set
    // only when the receive completed, its credits waited for the run's idle flush behind a
    // send listed first that waited for the peer's credits in turn: a 64 KiB sendrecv over
    // tcp took 45 us instead of 25).
    owesCredits |= !m.announced;
  }
}

bool Engine::MessageRun::announceReceive(const Message& m) {
  Link& link = *links[m.link].link;
  if (!PostedReceive::eligible(m.count, m.dtype) ||
      m.id - link.messagesReceivedDone >= PostedReceives::kWindow) {
    return false;
  }
  const PostedReceive notice{m.id, static_cast<uint32_t>(m.count), m.dtype};
  // Best effort: a full queue or a failed connection only leaves the sender to its credits
  // (the failure itself surfaces at the next poll).
  return link.connection().postWrite({}, link.peerSlots, 0,
                                     makeImm(ImmTag::kControl, kPostedReceiveBit | notice.pack()),
                                     workId(WorkKind::kControl, 0, 0)) == PostResult::kOk;
}

bool Engine::MessageRun::receiverPosted(Run& run, const Message& m) {
  if (!PostedReceive::eligible(m.count, m.dtype))
    return false;
  Link& link = *links[m.link].link;
  const std::optional<PostedReceive> posted = link.postedReceives.take(m.id);
  if (!posted)
    return false;
  const int me = engine.rank_, peer = link.peer();
  // The receiver finds the same disagreement in the chunk's header and says it in these words
  // (Run::callMismatch): both ranks report the same cause.
  if (posted->count != m.count) {
    run.fail(
        Errc::kInvalidArgument, peer,
        formatString("message sizes differ: rank %d sends %llu elements to rank %d, whose "
                     "receive (message #%u from rank %d) expects %u",
                     me, static_cast<unsigned long long>(m.count), peer, m.id, me, posted->count));
  }
  if (posted->dtype != m.dtype) {
    run.fail(Errc::kInvalidArgument, peer,
             formatString("dtype differs between ranks: rank %d called with %s, rank %d with %s",
                          me, dataTypeName(m.dtype), peer, dataTypeName(posted->dtype)));
  }
  return true;
}

void Engine::MessageRun::completeSends(Run* run) {
  for (size_t li = 0; li < links.size(); ++li) {
    Run::LinkRun& lr = links[li];
    while (sendsDone[li] < sendsOf[li].size()) {
      Message& m = list[sendsOf[li][sendsDone[li]]];
      // Its bytes are out of the buffer, and the receiver has them (its credits came back, or
      // it took the box) or has posted the receive that takes them.
      if (m.boxed) {
        if (!m.posted || (!lr.link->connection().boxAccepted(
                              m.box, m.id, static_cast<uint32_t>(m.dtype), m.count) &&
                          (run == nullptr || !receiverPosted(*run, m)))) {
          break;
        }
      } else {
        if (lr.completed < m.end)
          break;
        if (lr.link->peerReleased < lr.sendBase + m.end && !receiverPosted(*run, m))
          break;
      }
      lr.link->postedReceives.drop(m.id);
      ++lr.link->messagesSentDone;
      m.done = true;
      ++sendsDone[li];
    }
  }
}

bool Engine::MessageRun::reportDone(Run* run) {
  bool progress = false;
  while (reported < list.size()) {
    const Message& m = list[reported];
    Run::LinkRun& lr = links[m.link];
    if (m.send) {
      if (!m.done)
        break;
    } else if (m.boxed) {
      if (!m.done)
        break;
      ++lr.link->messagesReceivedDone;
    } else {
      if (lr.processed < m.end)
        break;
      // A sender whose send waits for these credits (no notice): they go now, not at the next
      // idle moment of a collective.
      if (!m.announced)
        run->returnCredits(m.link, true);
      ++lr.link->messagesReceivedDone;
    }
    feed->completed(reported++);
    progress = true;
  }
  return progress;
}

bool Engine::MessageRun::admitMore() {
  incoming.clear();
  feed->more(incoming);
  if (incoming.empty())
    return false;
  admit(incoming);
  return true;
}

bool Engine::MessageRun::advance(Run& run, bool idle) {
  bool progress = false;
  announceReceives();
  progress |= postBoxes();
  expectBoxes();
  progress |= takeBoxes(&run);
  completeSends(&run);
  idleRounds = idle ? idleRounds + 1 : 0;
  if (idle) {
    announceWaitingBoxes();
    checkNotInBox(run);
  }
  progress |= reportDone(&run);
  if ((idle || reported == list.size()) && admitMore()) {
    announceReceives();
    progress = true;
  }
  return progress;
}

bool Engine::MessageRun::finished() const {
  if (reported < list.size())
    return false;
  for (const Run::LinkRun& lr : links) {
    if ((owesCredits && lr.link->released > lr.link->creditAdvertised) ||
        lr.link->readsAcknowledged < lr.link->readsFromPeer)
      return false;  // the progress loop's idle round returns them
  }
  return true;
}

bool Engine::MessageRun::runBoxed() {
  // Where ranks outnumber cores (yieldAfter_ 0) the loop yields the core at its first idle
  // round, to the peer it likely waits for: spinning on held it (4 ranks on 2 cores, 8 B
  // sendrecv: 14-16 us against 8-9).
  const uint32_t handOverAfter = engine.yieldAfter_.count() == 0 ? 1 : kBoxedIdleRounds;
  uint32_t idle = 0;
  while (chunked == 0 && idle < handOverAfter) {
    bool progress = postBoxes();
    expectBoxes();
    progress |= takeBoxes(nullptr);
    if (boxTrouble)
      return false;
    completeSends(nullptr);
    progress |= reportDone(nullptr);
    if (reported == list.size()) {
      if (!admitMore())
        return finished();
      progress = true;
    }
    if (engine.abortFlag_.load(std::memory_order_relaxed))
      return false;
    idle = progress ? 0 : idle + 1;
  }
  return false;
}

void Engine::runPointToPoint(const CollectiveArgs& base,
                             const std::vector<PointToPointOp>& first,
                             const PointToPointFeed& feed) {
  GS_CHECK(base.kind == CollectiveKind::kPointToPoint, Errc::kInternal,
           "runPointToPoint needs a point-to-point call, not %s", collectiveName(base.kind));
  if (deferredAbort_ != nullptr) [[unlikely]]
    raiseDeferredAbort(base.kind, pointToPointRuns_++);
  stats_ = {};
  lastAlgorithm_ = "p2p";
  if (messageRun_ == nullptr)
    messageRun_ = std::make_unique<MessageRun>(*this);
  MessageRun& messages = *messageRun_;
  messages.begin(base, feed);
  struct End {  // however the run ends
    MessageRun& messages;
    ~End() { messages.end(); }
  } end{messages};
  messages.admit(first);
  const uint32_t id = pointToPointRuns_++;
  const uint64_t startNs = nowNs();
  if (!messages.runBoxed()) {
    Run run(*this, base, id, messages.plan, messages.links);
    run.messages = &messages;
    run.execute(startNs);
  }
  const uint64_t endNs = nowNs();
  stats_.elapsedNs = elapsedNs(startNs, endNs);
  Run::finishLinks(messages.links, startNs, endNs);
}

}  // namespace gs::stream
