// Engine::Run, the progress loop: polls every link, acts on completions, posts what the
// dependencies and credits allow, and fails at the deadline.
#include <algorithm>
#include <cstring>
#include <thread>

#include "codecs/reduce.h"
#include "common/error.h"
#include "common/log.h"
#include "stream/engine_run.h"

namespace gs::stream {
namespace {

// How long a point-to-point run idles before it returns credits held for announced messages.
constexpr std::chrono::microseconds kAnnouncedCreditHold(20);

// Runs with this many sockets or more ask the kernel which have data before reading any
// (Run::checkReadiness).
constexpr size_t kReadinessMinSockets = 4;

}  // namespace

bool Engine::Run::satisfied(uint32_t begin, uint32_t end) const {
  for (uint32_t i = begin; i < end; ++i) {
    const Dependency& d = plan.deps[i];
    const LinkRun& l = links[d.link];
    if ((d.onSend ? l.completed : l.processed) < d.count)
      return false;
  }
  return true;
}

bool Engine::Run::checkReadiness() {
  std::vector<pollfd>& fds = engine.readinessFds_;
  std::vector<uint32_t>& at = engine.readinessAt_;
  fds.clear();
  at.resize(links.size() + 1);
  for (size_t li = 0; li < links.size(); ++li) {
    at[li] = static_cast<uint32_t>(fds.size());
    links[li].link->connection().appendReadinessFds(fds);
  }
  at[links.size()] = static_cast<uint32_t>(fds.size());
  if (fds.empty())
    return false;
  // Up to three sockets a read each costs no more than the check, and a socket with data then
  // takes one system call instead of two (2 ranks over tcp, 8 B allreduce: 5.0-5.1 us reading
  // both sockets, 5.2-5.4 checking first). Failed or interrupted: every socket is read.
  if (fds.size() < kReadinessMinSockets || ::poll(fds.data(), fds.size(), 0) < 0)
    return true;
  for (size_t li = 0; li < links.size(); ++li) {
    if (at[li + 1] > at[li])
      links[li].link->connection().takeReadiness(
          std::span<const pollfd>(fds.data() + at[li], at[li + 1] - at[li]));
  }
  return true;
}

bool Engine::Run::pollLink(size_t li) {
  Link& link = *links[li].link;
  bool progress = false;
  if (!link.earlyCompletions.empty()) {
    // Arrived while the link was being set up (see Link::earlyCompletions).
    std::vector<Completion> early;
    early.swap(link.earlyCompletions);
    for (const Completion& c : early)
      onCompletion(li, c);
    progress = true;
  }
  for (;;) {
    const size_t n = link.connection().poll(completions);
    for (size_t i = 0; i < n; ++i) {
      onCompletion(li, completions[i]);
      progress |= !isLivenessCheck(completions[i]);
    }
    if (n < completions.size())
      break;
  }
  return progress;
}

// Pings, pongs and their send completions say a peer is alive, not that the collective moves:
// they must not reset the timeout they are part of.
bool Engine::Run::isLivenessCheck(const Completion& c) {
  if (c.kind == CompletionKind::kWrite)
    return c.status == Errc::kOk && workKind(c.id) == WorkKind::kControl;
  return c.kind == CompletionKind::kRemoteWrite &&
         (isControl(c.imm, ControlCode::kPing) || isControl(c.imm, ControlCode::kPong));
}

void Engine::Run::onCompletion(size_t li, const Completion& c) {
  switch (c.kind) {
    case CompletionKind::kError:
      connectionFailed(li);
    case CompletionKind::kWrite:
      if (c.status != Errc::kOk)
        connectionFailed(li);
      if (workKind(c.id) == WorkKind::kData)
        onSendComplete(workLink(c.id), workIndex(c.id));
      break;
    case CompletionKind::kRemoteWrite:
      onRemoteWrite(li, c);
      break;
    case CompletionKind::kSend:
    case CompletionKind::kRecv:
      break;  // not used by the chunk protocol
  }
}

void Engine::Run::onRemoteWrite(size_t li, const Completion& c) {
  Link& link = *links[li].link;
  const uint32_t payload = c.imm & kImmPayloadMask;
  switch (immTag(c.imm)) {
    case ImmTag::kData:
      // A peer that ignores credits must not overwrite a slot still being reduced or
      // forwarded.
      if (payload >= link.layout().slots || link.slotInUse[payload]) {
        fail(Errc::kRemote, link.peer(),
             formatString("rank %d wrote into slot %u, which is not free", link.peer(), payload));
      }
      link.arrivedBytes[payload] = c.length;
      link.slotInUse[payload] = 1;
      link.landedInPlace[payload] =
          links[li].lands && c.id == transport::Connection::kLandedInPlace ? 1 : 0;
      if (links[li].counters != nullptr)
        links[li].counters->onChunkReceived(c.length);
      break;
    case ImmTag::kCredit:
      GS_LOG_TRACE("credit from rank %d: %u (had %llu)", link.peer(), payload,
                   static_cast<unsigned long long>(link.peerReleased));
      link.applyCredit(payload);
      if (links[li].counters != nullptr)
        links[li].counters->touch();
      break;
    case ImmTag::kControl:
      if ((payload & kReadAckBit) != 0) {
        link.applyReadAck(payload & kReadAckMask);
        onReadAck(li);
        break;
      }
      if ((payload & kPostedReceiveBit) != 0) {
        link.postedReceives.note(PostedReceive::unpack(payload & kPostedReceiveMask),
                                 link.messagesSentDone);
        break;
      }
      onControl(li, static_cast<ControlCode>(payload));
      break;
    case ImmTag::kAbort:
      // The peer gave up. On this collective (or a notice without its progress, or a message
      // run, whose peers' progress is not counted): this call fails, as on the peer. On a later
      // call, this one completed there (a rank done with a call goes on to the next), and the
      // chunks it sent before may be all this call still needs from it: it goes on with them
      // and fails only once it waits for this peer (onPeerAborted); the next call fails with
      // the notice. Failing at once failed a collective, on a rank the failure did not concern,
      // that every other rank had completed.
      link.abortReceived = true;
      link.abortNotice = noticeFrom(link, c);
      if (messages != nullptr || link.abortNotice.senderCompleted <= collectiveId)
        raise(link.abortNotice, link.peer());
      peerAborted = true;
      break;
    default:
      fail(Errc::kRemote, link.peer(),
           formatString("rank %d sent an unknown message", link.peer()));
  }
}

bool Engine::Run::waitsOn(const LinkRun& l) const {
  return l.processed < l.queues->recvs.size() || l.completed < l.queues->sends.size() ||
         awaitsCredits(l);
}

void Engine::Run::onPeerAborted(std::chrono::nanoseconds idle) {
  // Chunks a peer sent before its abort may still arrive after it: tcp spreads a connection's
  // messages over several sockets, and only shm and an RC queue pair keep their order. What
  // was written before the abort is ahead of it in the peer's kernel, so a short quiet spell
  // is enough; a peer that closes its connection after the abort ends the wait sooner
  // (connectionFailed reports its notice).
  constexpr auto kDrain = std::chrono::milliseconds(20);
  const LinkRun* first = nullptr;
  for (const LinkRun& l : links) {
    if (!l.link->abortReceived)
      continue;
    if (waitsOn(l) && idle >= kDrain)
      raise(l.link->abortNotice, l.link->peer());
    if (first == nullptr)
      first = &l;
  }
  // What this call waits for comes from ranks that did not abort: they send it, or pass the
  // abort on once they learn of it. A grace bounds the wait for a rank that does neither
  // (idle between calls, its part of this one done).
  if (first != nullptr && idle >= engine.livenessGrace())
    raise(first->link->abortNotice, first->link->peer());
}

void Engine::Run::keepPeerAbort() {
  if (!peerAborted)
    return;
  for (const LinkRun& l : links) {
    if (l.link->abortReceived) {
      engine.deferredAbort_ = l.link;
      return;
    }
  }
}

bool Engine::Run::done() const {
  for (const LinkRun& l : links) {
    if (l.completed < l.queues->sends.size() || l.releasedHere < l.queues->recvs.size() ||
        l.link->readsAcknowledged < l.link->readsFromPeer) {
      return false;
    }
  }
  return true;
}

void Engine::Run::execute(uint64_t startNs) {
  // Raw chunks a receive copies out as they are land in place where the transport can (tcp:
  // read from the socket straight to dst, sparing the copy out of the slot; a 2-rank 1 MiB
  // sendrecv spent 16 % of its time in that copy). The landings end with the run, whatever
  // ends it: the buffers are the caller's again.
  struct Landings {
    std::vector<LinkRun>& links;
    ~Landings() {
      for (LinkRun& lr : links) {
        if (lr.lands)
          lr.link->connection().clearLandings();
      }
    }
  } landings{links};
  for (size_t li = 0; li < links.size(); ++li) {
    links[li].lands = links[li].link->connection().landsInPlace();
    links[li].armed = 0;
    armLandings(li);
  }
  auto lastProgress = Clock::time_point(std::chrono::nanoseconds(startNs));
  // The clock (cycle::steadyNow, the counter's: a steady read per round was a tenth of a
  // waiting rank's own time where ranks outnumber cores) is read in idle rounds only: a round that
  // made progress restarts the no-progress timer, which the next idle round's reading dates (one
  // round late at most, well under the spin time). Small calls finish in a few progressing rounds
  // and read it not at all.
  bool progressUndated = false;
  const auto timeout = std::chrono::milliseconds(engine.config_.timeoutMs);
  int idle = 0;
  // Point-to-point runs count as small: their messages are what a waiting rank answers.
  const size_t bytes = messages != nullptr ? 0 : args.count * elementSize;
  const bool delayCredits = messages == nullptr && engine.creditFlushAfter_.count() > 0 &&
                            (engine.spinMaxBytes_ == 0 || bytes <= engine.spinMaxBytes_);
  // An announced message's sender completes on the notice, not on its credits: they only
  // refill its slots, of which it keeps at least half while fewer than a batch are held. Sent
  // at the first idle moment they cost a write per message where the peer answers in
  // microseconds (over tcp a system call each, a third of a small sendrecv's).
  const auto creditFlushAfter = messages != nullptr
                                    ? std::max(engine.creditFlushAfter_, kAnnouncedCreditHold)
                                    : engine.creditFlushAfter_;
  const auto spinTime = engine.spinMaxBytes_ == 0 || bytes <= engine.spinMaxBytes_
                            ? engine.spinTime_
                            : std::chrono::microseconds(0);
  const bool batchPosts = bytes <= kPostBatchMaxBytes;
  // Small calls' rounds are mostly idle polls; a large call's reads mostly find data. A run
  // whose links have no sockets (shm) stops asking after its first round.
  bool checkSockets = bytes <= kPostBatchMaxBytes;
  for (;;) {
    // What this round posts leaves together at its end (tcp: one writev per socket).
    PostBatch batch(links, batchPosts);
    bool progress = false;
    if (checkSockets)
      checkSockets = checkReadiness();
    for (size_t li = 0; li < links.size(); ++li)
      progress |= pollLink(li);
    // What may go out goes before this rank copies anything in: a receive can be long (the
    // single copy out of a peer's memory), and a peer waiting for our chunks meanwhile idles.
    for (size_t li = 0; li < links.size(); ++li)
      progress |= postSends(li);
    for (size_t li = 0; li < links.size(); ++li) {
      progress |= processRecvs(li);
      progress |= releaseSlots(li);
      progress |= postSends(li);
    }
    // Credits short of a batch go back at the first idle moment, when this rank waits anyway;
    // where ranks outnumber cores that moment is another rank's core time, so they wait for
    // creditFlushAfter_ of idling (Engine::setCreditFlushAfter). A point-to-point run returns
    // them at once while a sender waits for them (a receive it did not announce,
    // MessageRun::owesCredits); an announced message's sender completes on the notice.
    const bool holdCredits = messages != nullptr ? !messages->owesCredits : delayCredits;
    if (!progress && !holdCredits) {
      for (size_t li = 0; li < links.size(); ++li)
        progress |= returnCredits(li, true);
    }
    bool over;
    if (messages != nullptr) {
      progress |= messages->advance(*this, !progress);
      over = messages->finished();
    } else {
      over = done();
    }
    // A batch of credits goes back with this round's posts, except the one that just filled
    // in a run's last round (returnCredits).
    for (size_t li = 0; li < links.size(); ++li)
      progress |= returnCredits(li, false, over);
    if (over)
      return keepPeerAbort();
    if (engine.abortFlag_.load(std::memory_order_relaxed))
      fail(Errc::kAborted, engine.rank_, "communicator aborted");
    if (progress) {
      progressUndated = true;
      idle = 0;
      check.asked = false;
      peerInSmallRounds = 0;
      continue;
    }
    batch.end();
    checkPeerNotInSmallExchange();
    const auto now = cycle::steadyNow();
    if (progressUndated) {
      lastProgress = now;
      progressUndated = false;
    }
    if (peerAborted)
      onPeerAborted(now - lastProgress);
    // Held credits go back after creditFlushAfter of idling, and before this rank sleeps: a
    // peer would wait for them through the sleep (up to 2 ms a call, 4 ranks on 2 cores).
    const bool sleepsNow = idle + 1 > engine.spinRounds_ && now - lastProgress >= spinTime;
    if (holdCredits && (sleepsNow || now - lastProgress >= creditFlushAfter)) {
      bool posted = false;
      for (size_t li = 0; li < links.size(); ++li)
        posted |= returnCredits(li, true);
      if (posted)
        continue;
    }
    if (now - lastProgress > timeout)
      onNoProgress(now);
    ++idle;
    if (idle > engine.spinRounds_ && now - lastProgress < spinTime) {
      // Still spinning (shm: the peer's next chunk is usually microseconds away). After a few
      // microseconds without progress, give the core up at each round to whatever else is
      // runnable on it: where other work (another rank, a compiler) shares this core, the peer
      // this rank waits for may be the thread waiting for it. With nothing else runnable,
      // yield returns at once, but costs a system call: not in the first microseconds, when a
      // peer on its own core answers.
      if (now - lastProgress >= engine.yieldAfter_) {
        engine.stayHome(now);
        std::this_thread::yield();
      }
      continue;
    }
    if (idle > engine.spinRounds_ && now - lastProgress >= spinTime) {
      // Past the timeout (a liveness check is out) in 1 ms steps. Only this run's links may
      // end the wait: another's unread news (credits from a link this schedule does not use)
      // would end every wait at once, a spin that took the core from the peers this rank waits
      // for (3 ranks on 2 cores over tcp, a 256 KiB allreduce: 2.5 ms a call instead of 0.25).
      auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(timeout - (now - lastProgress));
      auto& watched = engine.watchedConnections_;
      watched.clear();
      for (const LinkRun& lr : links)
        watched.push_back(&lr.link->connection());
      engine.waitForActivity(
          std::clamp(left, std::chrono::microseconds(1000), std::chrono::microseconds(2000)),
          watched);
    }
  }
}

}  // namespace gs::stream
