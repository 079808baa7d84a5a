// Engine::Run, failure handling: who is at fault, the notice every rank reports, the liveness
// check of a collective that stopped progressing; the Engine's notifyPeers and farewell.
#include <algorithm>
#include <cstring>

#include "codecs/reduce.h"
#include "common/error.h"
#include "common/log.h"
#include "stream/engine_run.h"

namespace gs::stream {

// This rank found the failure: it is the detector, blamedRank the rank at fault.
void Engine::Run::fail(Errc code, int blamedRank, const std::string& cause) {
  raise(FailureNotice{code, blamedRank, engine.rank_, cause}, -1);
}

// Passes the notice on (unchanged: every rank reports the same cause) and throws this rank's
// error for it. passedOnBy: the peer it came from (-1: found here).
void Engine::Run::raise(const FailureNotice& notice, int passedOnBy) {
  engine.raiseNotice(args.kind, collectiveId, notice, passedOnBy);
}

void Engine::raiseNotice(CollectiveKind kind,
                         uint32_t id,
                         const FailureNotice& notice,
                         int passedOnBy) {
  notifyPeers(notice);
  throw Error(notice.code, formatString("%s #%u on rank %d: %s", collectiveName(kind), id, rank_,
                                        describe(notice, passedOnBy).c_str()));
}

void Engine::raiseDeferredAbort(CollectiveKind kind, uint32_t id) {
  raiseNotice(kind, id, deferredAbort_->abortNotice, deferredAbort_->peer());
}

// The notice behind an abort message from `link`: the cause it carries, or (a write without
// one, or one that does not decode) just the rank it names.
FailureNotice Engine::Run::noticeFrom(Link& link, const Completion& c) const {
  const int origin = static_cast<int>(c.imm & kImmPayloadMask);
  if (c.length > 0) {
    if (auto n = decodeNotice(link.notice(), std::min<size_t>(c.length, SlotLayout::kNoticeBytes),
                              engine.nranks_)) {
      return *n;
    }
  }
  return FailureNotice{Errc::kRemote, origin, link.peer(), formatString("rank %d failed", origin)};
}

void Engine::Run::connectionFailed(size_t li) {
  Link& link = *links[li].link;
  // A peer that aborted leaves: the cause is its notice, not the closed connection.
  for (const LinkRun& l : links) {
    if (l.link->abortReceived)
      raise(l.link->abortNotice, l.link->peer());
  }
  std::string why = link.connection().errorMessage();
  // A neighbour that closed may only have been passing on another rank's failure, and the
  // notice naming that rank may come over another link: listen briefly before blaming it.
  FailureNotice notice;
  int reporter = -1;
  if (findAbortNotice(li, Deadline::after(std::chrono::milliseconds(200)), &notice, &reporter))
    raise(notice, reporter);
  // The transport's message names the peer already ("connection to rank 2 (...) reset by
  // peer", "peer rank 2 (pid ...) exited").
  fail(Errc::kRemote, link.peer(),
       why.empty() ? formatString("connection to rank %d failed", link.peer()) : why);
}

// Polls the links other than `failed` for an abort notice until the deadline (the collective
// is failing: other completions are dropped).
bool Engine::Run::findAbortNotice(size_t failed,
                                  Deadline deadline,
                                  FailureNotice* notice,
                                  int* reporter) {
  std::array<Completion, 16> sink;
  bool any = false;
  for (size_t li = 0; li < links.size(); ++li)
    any |= li != failed && links[li].link != links[failed].link;
  if (!any)
    return false;
  while (!deadline.expired()) {
    for (size_t li = 0; li < links.size(); ++li) {
      Link& other = *links[li].link;
      if (li == failed || &other == links[failed].link)
        continue;
      const size_t n = other.connection().poll(sink);
      for (size_t k = 0; k < n; ++k) {
        if (sink[k].kind == CompletionKind::kRemoteWrite && immTag(sink[k].imm) == ImmTag::kAbort) {
          other.abortReceived = true;
          *notice = noticeFrom(other, sink[k]);
          *reporter = other.peer();
          return true;
        }
      }
    }
    engine.waitForActivity(std::chrono::microseconds(2000));
  }
  return false;
}

// What the collective is waiting for, for the timeout message.
std::string Engine::Run::waitingFor() const {
  for (const LinkRun& l : links) {
    if (l.processed < l.queues->recvs.size()) {
      const RecvOp& op = l.queues->recvs[l.processed];
      if (messages != nullptr) {
        return formatString(
            "waiting for chunk %u of message #%u from rank %d: a send it has not "
            "posted?",
            op.chunkIndex, messageOf(op.message).id, l.link->peer());
      }
      return formatString("waiting for chunk %u of step %u from rank %d", op.chunkIndex, op.step,
                          l.link->peer());
    }
  }
  for (const LinkRun& l : links) {
    if (l.posted < l.queues->sends.size() || l.completed < l.posted || awaitsCredits(l)) {
      if (messages != nullptr) {
        return formatString(
            "waiting for rank %d to receive a message (it released %llu of the %llu chunks sent "
            "to it): a receive it has not posted?",
            l.link->peer(), static_cast<unsigned long long>(l.link->peerReleased),
            static_cast<unsigned long long>(l.link->sendSequence));
      }
      return formatString("waiting to send to rank %d (credits from it: %llu of %llu chunks)",
                          l.link->peer(), static_cast<unsigned long long>(l.link->peerReleased),
                          static_cast<unsigned long long>(l.link->sendSequence));
    }
  }
  return "waiting to return credits";
}

// The link this rank waits on: the first with a chunk still to come, else the first still
// waiting for credits, else the first.
size_t Engine::Run::blockingLink() const {
  for (size_t li = 0; li < links.size(); ++li) {
    if (links[li].processed < links[li].queues->recvs.size())
      return li;
  }
  for (size_t li = 0; li < links.size(); ++li) {
    if (links[li].completed < links[li].queues->sends.size() || awaitsCredits(links[li]))
      return li;
  }
  return 0;
}

void Engine::Run::onControl(size_t li, ControlCode code) {
  Link& link = *links[li].link;
  switch (code) {
    case ControlCode::kBye:
      link.byeReceived = true;
      return;
    case ControlCode::kPing:
      // Best effort: a full queue only makes the asking rank wait for its grace.
      (void)link.connection().postWrite({}, link.peerSlots, 0, makeControl(ControlCode::kPong),
                                        workId(WorkKind::kControl, 0, 0));
      return;
    case ControlCode::kPong:
      links[li].answered = true;
      return;
  }
  fail(Errc::kRemote, link.peer(),
       formatString("rank %d sent an unknown control message", link.peer()));
}

void Engine::Run::onNoProgress(Clock::time_point now) {
  const auto grace = engine.livenessGrace();
  if (!check.asked) {
    check = LivenessCheck{true, blockingLink(), now, waitingFor()};
    Link& link = *links[check.link].link;
    links[check.link].answered = false;
    (void)link.connection().postWrite({}, link.peerSlots, 0, makeControl(ControlCode::kPing),
                                      workId(WorkKind::kControl, 0, 0));
    return;
  }
  const int suspect = links[check.link].link->peer();
  const long long timeoutMs = static_cast<long long>(engine.config_.timeoutMs);
  const long long graceMs =
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(grace).count());
  if (!links[check.link].answered) {
    if (now - check.at < grace)
      return;
    fail(Errc::kTimeout, suspect,
         formatString("rank %d stopped making progress: rank %d got nothing from it for %lld ms "
                      "(%s) and no answer to a liveness check within %lld ms (stopped, hung or "
                      "starved of CPU?)",
                      suspect, engine.rank_, timeoutMs, check.waiting.c_str(), graceMs));
  }
  if (now - check.at < 3 * grace)
    return;
  fail(Errc::kTimeout, suspect,
       formatString("no progress for %lld ms (%s); rank %d answers a liveness check but made "
                    "no progress either, and no rank named a cause within %lld ms",
                    timeoutMs, check.waiting.c_str(), suspect, 3 * graceMs));
}

void Engine::notifyPeers(Errc code, const std::string& cause) noexcept {
  try {
    notifyPeers(FailureNotice{code, rank_, rank_, cause});
  } catch (...) {
    // The cause's copy ran out of memory: the peers learn by timeout.
  }
}

std::string Engine::describe(const FailureNotice& n, int passedOnBy) const {
  if (n.detector == rank_)
    return n.cause;
  // A call mismatch (kInvalidArgument) names both ranks in its cause: neither is "at fault".
  if (n.origin == rank_ && n.code != Errc::kInvalidArgument) {
    return formatString("rank %d reported this rank at fault: %s", n.detector, n.cause.c_str());
  }
  if (passedOnBy < 0 || passedOnBy == n.detector)
    return formatString("%s (detected by rank %d)", n.cause.c_str(), n.detector);
  return formatString("%s (detected by rank %d, passed on by rank %d)", n.cause.c_str(), n.detector,
                      passedOnBy);
}

std::chrono::nanoseconds Engine::livenessGrace() const {
  // A rank in a collective polls every few ms; a quarter of the timeout (100 ms to 2 s) leaves
  // room for a loaded host without adding much to the time to the error.
  return std::clamp<std::chrono::nanoseconds>(std::chrono::milliseconds(config_.timeoutMs) / 4,
                                              std::chrono::milliseconds(100),
                                              std::chrono::seconds(2));
}

void Engine::notifyPeers(const FailureNotice& notice) noexcept {
  if (notified_)
    return;
  notified_ = true;
  FailureNotice sent = notice;  // passed on unchanged, but for this rank's own progress
  sent.senderCompleted = completedCollectives_;
  // Per link: the notice has left; the peer is done with it (it passed a notice back: every
  // rank that learns of a failure tells all its links, this one included) or is gone.
  struct Telling {
    Link* link;
    bool sent = false, done = false;
  };
  std::vector<Telling> telling;
  for (Link* link : links_) {
    if (link == nullptr || !link->connected())
      continue;
    // A peer waiting in a small exchange polls its mailbox, not the connection's notices.
    link->connection().postSmallFailure(link->smallSequenceDone);
    // The cause goes into the peer's notice page, the abort message names the rank at fault
    // (all a peer has if the notice cannot be read). Best effort: a full queue or a dead
    // connection just means this peer learns by timeout.
    const size_t bytes = encodeNotice(sent, link->noticeStaging(), SlotLayout::kNoticeBytes);
    const transport::LocalSegment segment{&link->headerRegion(), link->noticeStagingOffset(),
                                          bytes};
    if (link->connection().postWrite(std::span<const transport::LocalSegment>(&segment, 1),
                                     link->peerSlots, link->layout().noticeOffset(),
                                     makeImm(ImmTag::kAbort, static_cast<uint32_t>(notice.origin)),
                                     workId(WorkKind::kAbort, 0, 0)) != PostResult::kOk) {
      continue;
    }
    // The rank at fault (stopped, or dead) is not waited for. A call mismatch names a live peer
    // that is reading this link (kInvalidArgument, see describe()): it is, or this rank's close
    // would reset a socket with its chunks unread and the peer would report "connection reset"
    // instead of the mismatch (FakeDeviceMessages.CountMismatch..., seen under TSan).
    const bool atFault = link->peer() == notice.origin && notice.code != Errc::kInvalidArgument;
    telling.push_back({link, false, link->abortReceived || atFault});
  }
  // Drive the connections until every notice has left (it may queue behind data) and every
  // live peer has passed one back, briefly. Without the wait a TCP socket closed right after
  // the error, with chunks still unread in its receive queue, is reset, and the peer loses the
  // notice still waiting in its own queue: it would report "connection reset", not the cause.
  const Deadline until = Deadline::after(std::chrono::milliseconds(300));
  transport::Completion sink[16];
  for (;;) {
    bool waiting = false, any = false;
    for (Telling& t : telling) {
      if (t.sent && t.done)
        continue;
      const size_t n = t.link->connection().poll(sink);
      any |= n > 0;
      for (size_t i = 0; i < n; ++i) {
        const Completion& c = sink[i];
        if (c.kind == CompletionKind::kError) {
          t.sent = t.done = true;
        } else if (c.kind == CompletionKind::kWrite && workKind(c.id) == WorkKind::kAbort) {
          t.sent = true;
        } else if (c.kind == CompletionKind::kRemoteWrite && immTag(c.imm) == ImmTag::kAbort) {
          t.link->abortReceived = true;
          t.done = true;
        }
      }
      waiting |= !(t.sent && t.done);
    }
    if (!waiting || until.expired())
      break;
    if (!any)
      waitForActivity(std::chrono::microseconds(1000));
  }
}

void Engine::farewell(Deadline deadline) noexcept {
  std::vector<Link*> waiting;
  for (Link* link : links_) {
    // A peer that aborted (deferredAbort_) says no goodbye.
    if (link == nullptr || !link->connected() || link->abortReceived)
      continue;
    if (link->connection().postWrite({}, link->peerSlots, 0, makeControl(ControlCode::kBye),
                                     workId(WorkKind::kControl, 0, 0)) == PostResult::kOk) {
      waiting.push_back(link);
    }
  }
  transport::Completion sink[32];
  while (!waiting.empty() && !deadline.expired()) {
    bool any = false;
    for (size_t i = 0; i < waiting.size();) {
      Link* link = waiting[i];
      const size_t n = link->connection().poll(sink);
      bool gone = false;
      for (size_t k = 0; k < n; ++k) {
        const auto& c = sink[k];
        if (c.kind == CompletionKind::kError)
          gone = true;
        if (c.kind == CompletionKind::kRemoteWrite && isControl(c.imm, ControlCode::kBye))
          link->byeReceived = true;
      }
      any |= n > 0;
      if (gone || link->byeReceived) {
        waiting[i] = waiting.back();
        waiting.pop_back();
      } else {
        ++i;
      }
    }
    if (!any && !waiting.empty()) {
      waitForActivity(
          std::min(std::chrono::duration_cast<std::chrono::microseconds>(deadline.remaining()),
                   std::chrono::microseconds(5000)));
    }
  }
  for (Link* link : waiting) {
    GS_LOG_DEBUG("rank %d did not close the communicator in time; closing anyway", link->peer());
  }
}

}  // namespace gs::stream
