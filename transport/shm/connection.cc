#include "transport/shm/connection.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/shm/device.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/peer_memory.h"

namespace gs::transport::shm {
namespace {

constexpr size_t kCompletionCapacity = 1024;
constexpr size_t kRecvCapacity = 256;
// Peer regions kept mapped per connection; beyond it the oldest mapping is dropped (and made
// again on its next use). The engine writes into one region per peer.
constexpr size_t kMaxMappedRegions = 64;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(5);
// The clock is looked at once in this many polls: a busy poll loop goes round in well under a
// microsecond, and a read of the clock (~25 ns) at each was a tenth of a 2-rank 8 B allreduce.
// A sleeping loop polls every 1-2 ms, so a dead peer is still found within ~40 ms.
constexpr uint32_t kPollsPerLivenessClock = 16;

// A descriptor that becomes readable when the process exits; -1 for ourselves (a rank that is
// a thread of this process) or where pidfd_open is missing (then kill(pid, 0) is used).
int openPidfd(int32_t pid) {
  if (pid <= 0 || pid == getpid())
    return -1;
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

bool processExited(int pidfd, int32_t pid) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  return processGone(pid);
}

}  // namespace

Connection::Connection(Device& device, ConnectionSetup setup)
    : device_(device),
      rank_(setup.rank),
      peer_(setup.peer),
      side_(setup.side),
      segment_(std::move(setup.segment)),
      block_(static_cast<ConnectionBlock*>(segment_->data())),
      peerControlSegment_(std::move(setup.peerControl)),
      peerControl_(static_cast<ControlBlock*>(peerControlSegment_->data())),
      peerPrefix_(std::move(setup.peerPrefix)),
      peerToken_(setup.peerToken),
      peerPid_(setup.peerPid),
      expectedPeerProof_(setup.expectedPeerProof),
      peerReady_(setup.side == 0),  // the acceptor checked the dialer's hello in connect()
      peerReadsUs_(setup.peerReadsUs),
      pidfd_(openPidfd(setup.peerPid)),
      completions_(kCompletionCapacity),
      recvs_(kRecvCapacity) {
  mapped_.reserve(kMaxMappedRegions);
  device_.attach(this);
}

Connection::~Connection() {
  device_.detach(this);
  storeRelease(outgoing().closed, 1u);
  ring(*peerControl_);
  if (pidfd_ >= 0)
    close(pidfd_);
}

void Connection::fail(std::string message) {
  if (failed_)
    return;
  failed_ = true;
  error_ = std::move(message);
  recvs_.clear();  // their memory is about to be reused
  // A failing end closes, so the peer learns too.
  storeRelease(outgoing().closed, 1u);
  ring(*peerControl_);
}

NoticeRoom Connection::noticeRoom() {
  // The peer's head moves only forward: one read of it is good until the queue looks full by
  // it, so the sender does not pull the line the receiver writes at every notice.
  if (noticeTail_ - noticeRoomHead_ < kNotices)
    return NoticeRoom::kRoom;
  const uint64_t head = loadAcquire(outgoing().noticeHead);
  if (noticeTail_ - head > kNotices) {
    fail(formatString("peer rank %d corrupted the shared notice queue", peer_));
    return NoticeRoom::kCorrupt;
  }
  noticeRoomHead_ = head;
  return noticeTail_ - head < kNotices ? NoticeRoom::kRoom : NoticeRoom::kFull;
}

bool Connection::pushNotice(const Notice& notice) {
  if (noticeRoom() != NoticeRoom::kRoom)
    return false;
  Notice& slot = outgoing().notices[noticeTail_ % kNotices];
  std::memcpy(&slot, &notice, offsetof(Notice, sequence));
  storeRelease(slot.sequence, ++noticeTail_);
  ring(*peerControl_);
  return true;
}

bool Connection::noticeArrived() const {
  Notice& slot = incoming().notices[noticeHead_ % kNotices];
  return std::atomic_ref<uint64_t>(slot.sequence).load(std::memory_order_acquire) ==
         noticeHead_ + 1;
}

void Connection::reject(RejectReason reason,
                        uint32_t length,
                        uint64_t detail,
                        std::string message) {
  // Best effort: when the queue is full, the closed flag that fail() sets still tells the peer.
  pushNotice(Notice{static_cast<uint32_t>(NoticeKind::kReject), 0, length,
                    static_cast<uint32_t>(reason), detail, 0});
  fail(std::move(message));
}

Segment* Connection::targetRegion(const RemoteKey& key, std::string* why) {
  RegionKey k;
  if (key.length != sizeof(RegionKey)) {
    *why = "the target is not shared memory (peers write only into regions from allocateRegion)";
    return nullptr;
  }
  std::memcpy(&k, key.bytes, sizeof(k));
  if (k.magic != RegionKey::kMagic) {
    *why = "the region key is malformed";
    return nullptr;
  }
  if (k.token != peerToken_) {
    *why = formatString("region key %u belongs to another device than rank %d's", k.id, peer_);
    return nullptr;
  }
  for (MappedRegion& m : mapped_) {
    if (m.id == k.id)
      return m.segment.get();
  }
  std::unique_ptr<Segment> segment;
  try {
    segment = Segment::open(regionSegmentName(peerPrefix_, k.id));
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
  if (!segment) {
    *why = formatString("region id %u is not registered", k.id);
    return nullptr;
  }
  if (mapped_.size() == kMaxMappedRegions)
    mapped_.erase(mapped_.begin());
  mapped_.push_back(MappedRegion{k.id, std::move(segment)});
  return mapped_.back().segment.get();
}

PostResult Connection::postWrite(std::span<const LocalSegment> segments,
                                 const RemoteKey& dst,
                                 uint64_t dstOffset,
                                 uint32_t imm,
                                 WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (segments.size() > kMaxSegments) {
    fail(formatString("postWrite with %zu segments (at most %zu)", segments.size(), kMaxSegments));
    return PostResult::kError;
  }
  const NoticeRoom room = noticeRoom();
  if (room == NoticeRoom::kCorrupt)
    return PostResult::kError;
  if (completions_.full() || room == NoticeRoom::kFull)
    return PostResult::kWouldBlock;
  uint64_t total = 0;
  for (const LocalSegment& s : segments)
    total += s.length;
  std::string why;
  Segment* target = targetRegion(dst, &why);
  if (target != nullptr &&
      (total > UINT32_MAX || dstOffset > target->size() || total > target->size() - dstOffset)) {
    why = formatString("write of %llu bytes at offset %llu is outside the region (%zu bytes)",
                       static_cast<unsigned long long>(total),
                       static_cast<unsigned long long>(dstOffset), target->size());
    target = nullptr;
  }
  if (target == nullptr) {
    reject(RejectReason::kBadWrite, static_cast<uint32_t>(std::min<uint64_t>(total, UINT32_MAX)),
           dstOffset, formatString("invalid write to rank %d: %s", peer_, why.c_str()));
    return PostResult::kError;
  }
  uint8_t* at = static_cast<uint8_t*>(target->data()) + dstOffset;
  for (const LocalSegment& s : segments) {
    if (s.length)
      std::memcpy(at, s.data(), s.length);
    at += s.length;
  }
  const auto length = static_cast<uint32_t>(total);
  pushNotice(Notice{static_cast<uint32_t>(NoticeKind::kWrite), imm, length, 0, 0, 0});
  completions_.push(Completion{id, CompletionKind::kWrite, Errc::kOk, 0, length});
  return PostResult::kOk;
}

PostResult Connection::postSend(const LocalSegment& segment, WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (segment.length > kMessageBytes) {
    fail(formatString("postSend of %zu bytes to rank %d: shm sends carry at most %zu bytes",
                      segment.length, peer_, kMessageBytes));
    return PostResult::kError;
  }
  Half& out = outgoing();
  const uint64_t head = loadAcquire(out.messageHead);
  if (messageTail_ - head > kMessages) {
    fail(formatString("peer rank %d corrupted the shared message queue", peer_));
    return PostResult::kError;
  }
  if (completions_.full() || messageTail_ - head == kMessages)
    return PostResult::kWouldBlock;
  Message& m = out.messages[messageTail_ % kMessages];
  m.length = static_cast<uint32_t>(segment.length);
  if (segment.length)
    std::memcpy(m.data, segment.data(), segment.length);
  storeRelease(out.messageTail, ++messageTail_);
  ring(*peerControl_);
  completions_.push(Completion{id, CompletionKind::kSend, Errc::kOk, 0, m.length});
  return PostResult::kOk;
}

PostResult Connection::postRecv(const LocalSegment& segment, WorkId id) {
  if (failed_)
    return PostResult::kError;
  return recvs_.push(PendingRecv{segment, id}) ? PostResult::kOk : PostResult::kWouldBlock;
}

bool Connection::peerHelloChecked() {
  if (peerReady_)
    return true;
  Half& in = incoming();
  if (loadAcquire(in.hello.state) != 1)
    return false;
  Hello hello;
  std::memcpy(&hello, &in.hello, sizeof(hello));
  if (hello.rank != peer_ || hello.token != peerToken_ ||
      !tagsEqual(hello.proof, expectedPeerProof_)) {
    GS_LOG_WARN("rejected shm connection from rank %d: its hello does not prove the secret", peer_);
    fail(formatString("rank %d answered with an invalid hello (different communicator secret?)",
                      peer_));
    return false;
  }
  peerReadsUs_ = hello.readsPeerMemory == 1;
  peerReady_ = true;
  return true;
}

bool Connection::readPeerMemory(uint64_t address, void* dst, size_t bytes, std::string* why) {
  if (failed_) {
    *why = error_;
    return false;
  }
  return readProcessMemory(peerPid_, address, dst, bytes, why);
}

size_t Connection::takeNotices(std::span<Completion> out) {
  Half& in = incoming();
  const uint64_t before = noticeHead_;
  size_t n = 0;
  while (n < out.size() && !failed_) {
    Notice& slot = in.notices[noticeHead_ % kNotices];
    const uint64_t sequence = loadAcquire(slot.sequence);
    if (sequence != noticeHead_ + 1) {
      // Not written yet, the slot still holds the notice of a lap before (nothing on the first
      // lap); any other sequence is the peer's scribbling.
      const uint64_t lapBefore = noticeHead_ >= kNotices ? noticeHead_ + 1 - kNotices : 0;
      if (sequence != lapBefore)
        fail(
            formatString("peer rank %d sent an invalid frame: its notice queue is corrupt", peer_));
      break;
    }
    Notice notice;
    std::memcpy(&notice, &slot, sizeof(notice));
    ++noticeHead_;
    if (notice.kind == static_cast<uint32_t>(NoticeKind::kWrite)) {
      out[n++] = Completion{0, CompletionKind::kRemoteWrite, Errc::kOk, notice.imm, notice.length};
    } else if (notice.kind == static_cast<uint32_t>(NoticeKind::kReject) &&
               notice.reason == static_cast<uint32_t>(RejectReason::kSendTooLong)) {
      fail(
          formatString("rank %d rejected our send: %u bytes exceed its posted receive buffer of "
                       "%llu",
                       peer_, notice.length, static_cast<unsigned long long>(notice.detail)));
    } else if (notice.kind == static_cast<uint32_t>(NoticeKind::kReject)) {
      fail(
          formatString("peer rank %d sent an invalid frame: a write of %u bytes at offset %llu "
                       "outside the regions this rank gave it",
                       peer_, notice.length, static_cast<unsigned long long>(notice.detail)));
    } else {
      fail(formatString("peer rank %d sent an invalid frame: notice kind %u", peer_, notice.kind));
    }
  }
  // Written only when it moved: the sender reads it only when its queue looks full.
  if (noticeHead_ != before)
    storeRelease(in.noticeHead, noticeHead_);
  return n;
}

size_t Connection::takeMessages(std::span<Completion> out) {
  Half& in = incoming();
  const uint64_t tail = loadAcquire(in.messageTail);
  if (tail - messageHead_ > kMessages) {
    fail(formatString("peer rank %d sent an invalid frame: its message queue is corrupt", peer_));
    return 0;
  }
  size_t n = 0;
  while (n < out.size() && messageHead_ != tail && !recvs_.empty()) {
    const Message& m = in.messages[messageHead_ % kMessages];
    const uint32_t length = m.length;  // read once: the peer could change it meanwhile
    const PendingRecv recv = recvs_.front();
    if (length > kMessageBytes) {
      fail(formatString("peer rank %d sent an invalid frame: a message of %u bytes (at most %zu)",
                        peer_, length, kMessageBytes));
      break;
    }
    if (length > recv.segment.length) {
      reject(RejectReason::kSendTooLong, length, recv.segment.length,
             formatString("peer rank %d sent an invalid frame: send of %u bytes exceeds the "
                          "posted receive buffer of %zu",
                          peer_, length, recv.segment.length));
      break;
    }
    if (length)
      std::memcpy(const_cast<uint8_t*>(recv.segment.data()), m.data, length);
    recvs_.pop();
    ++messageHead_;
    out[n++] = Completion{recv.id, CompletionKind::kRecv, Errc::kOk, 0, length};
  }
  if (n > 0)
    storeRelease(in.messageHead, messageHead_);
  return n;
}

void Connection::checkPeerAlive() {
  // Its last notices came before its closed flag (release order): report those first.
  if (loadAcquire(incoming().closed) != 0 && !noticeArrived()) {
    fail(formatString("peer rank %d closed the connection", peer_));
    return;
  }
  if (loadAcquire(peerControl_->closed) != 0) {
    fail(formatString("peer rank %d closed the connection (its device is gone)", peer_));
    return;
  }
  if (++pollsSinceClock_ < kPollsPerLivenessClock)
    return;
  pollsSinceClock_ = 0;
  const auto now = Clock::now();
  if (now < nextLivenessCheck_)
    return;
  nextLivenessCheck_ = now + kLivenessPeriod;
  if (processExited(pidfd_, peerPid_))
    fail(formatString("peer rank %d (pid %d) exited: connection reset", peer_, peerPid_));
}

void Connection::postSmall(uint64_t sequence, uint64_t tag, const void* data, uint32_t bytes) {
  SmallBox& box = outgoing().small[sequence % 2];
  std::memcpy(box.data, data, std::min<size_t>(bytes, kSmallBytes));
  box.tag = tag;
  box.bytes = bytes;
  storeRelease(box.sequence, sequence);
  ring(*peerControl_);  // a peer asleep on its doorbell (ranks outnumbering cores)
}

SmallPoll Connection::pollSmall(uint64_t sequence, SmallArrival* out) {
  if (failed_)
    return SmallPoll::kFailed;
  // A peer that failed after posting its part failed this exchange too (as in the chunk
  // protocol, where its abort notice follows its chunks): the flag decides, unless the peer
  // completed the call of this exchange before it failed (the flag says through which). Its
  // part, when there, is described all the same: a mismatch the caller finds in it is the
  // cause itself, which a third rank that gave up first may not have passed on yet.
  const uint64_t failedFrom = loadAcquire(incoming().smallFailed);
  const bool peerFailed = failedFrom != 0 && sequence >= failedFrom;
  SmallBox& box = incoming().small[sequence % 2];
  if (loadAcquire(box.sequence) == sequence) {
    // Copied once and checked: the peer may scribble on the box, never make us read past it.
    const uint32_t bytes = std::atomic_ref<uint32_t>(box.bytes).load(std::memory_order_relaxed);
    if (bytes > kSmallBytes) {
      reject(RejectReason::kBadWrite, bytes, 0,
             formatString("peer rank %d posted a small exchange of %u bytes (at most %zu)", peer_,
                          bytes, kSmallBytes));
      return SmallPoll::kFailed;
    }
    smallTaken_ = sequence;
    out->tag = std::atomic_ref<uint64_t>(box.tag).load(std::memory_order_relaxed);
    out->bytes = bytes;
    out->data = box.data;
    return peerFailed ? SmallPoll::kPeerFailed : SmallPoll::kArrived;
  }
  if (peerFailed)
    return SmallPoll::kPeerFailed;
  checkPeerAlive();
  return failed_ ? SmallPoll::kFailed : SmallPoll::kPending;
}

namespace {
// Whether the use before `sequence` of its box (sequence - kMessageBoxes) was taken: the box
// and its receipt are free for `sequence` (postBox, expectBox).
bool previousUseTaken(BoxReceipt& receipt, uint64_t sequence) {
  return sequence <= kMessageBoxes || loadAcquire(receipt.taken) == sequence - kMessageBoxes;
}
}  // namespace

bool Connection::postBox(uint64_t sequence,
                         uint32_t ordinal,
                         uint32_t dtype,
                         uint64_t count,
                         const void* data,
                         uint32_t bytes) {
  Half& out = outgoing();
  const size_t b = (sequence - 1) % kMessageBoxes;
  // Its previous use is taken (the peer writes that word in our half; it can only delay us).
  if (!previousUseTaken(out.receipts[b], sequence))
    return false;
  MessageBox& box = out.boxes[b];
  std::memcpy(box.data, data, std::min<size_t>(bytes, kMessageBoxBytes));
  box.ordinal = ordinal;
  box.dtype = dtype;
  box.count = count;
  box.bytes = bytes;
  storeRelease(box.sequence, sequence);
  ring(*peerControl_);  // a peer asleep on its doorbell (ranks outnumbering cores)
  return true;
}

bool Connection::readBox(MessageBox& box, BoxArrival* out) {
  const uint32_t bytes = std::atomic_ref<uint32_t>(box.bytes).load(std::memory_order_relaxed);
  if (bytes > kMessageBoxBytes) {
    reject(RejectReason::kBadWrite, bytes, 0,
           formatString("peer rank %d posted a message of %u bytes in a box (at most %zu)", peer_,
                        bytes, kMessageBoxBytes));
    return false;
  }
  out->ordinal = std::atomic_ref<uint32_t>(box.ordinal).load(std::memory_order_relaxed);
  out->dtype = std::atomic_ref<uint32_t>(box.dtype).load(std::memory_order_relaxed);
  out->count = std::atomic_ref<uint64_t>(box.count).load(std::memory_order_relaxed);
  out->bytes = bytes;
  out->data = box.data;
  return true;
}

BoxPoll Connection::pollBox(uint64_t sequence, BoxArrival* out) {
  if (failed_)
    return BoxPoll::kFailed;
  MessageBox& box = incoming().boxes[(sequence - 1) % kMessageBoxes];
  if (loadAcquire(box.sequence) == sequence)
    return readBox(box, out) ? BoxPoll::kArrived : BoxPoll::kFailed;
  checkPeerAlive();
  return failed_ ? BoxPoll::kFailed : BoxPoll::kPending;
}

void Connection::takeBox(uint64_t sequence) {
  storeRelease(incoming().receipts[(sequence - 1) % kMessageBoxes].taken, sequence);
  ring(*peerControl_);  // a sender asleep waiting for the box
}

bool Connection::boxTaken(uint64_t sequence) const {
  return loadAcquire(outgoing().receipts[(sequence - 1) % kMessageBoxes].taken) >= sequence;
}

bool Connection::expectBox(uint64_t sequence, uint32_t ordinal, uint32_t dtype, uint64_t count) {
  if (failed_)
    return false;
  BoxReceipt& r = incoming().receipts[(sequence - 1) % kMessageBoxes];
  // Until the previous use is taken its sender may still read this receipt for that use.
  if (!previousUseTaken(r, sequence))
    return false;
  constexpr auto relaxed = std::memory_order_relaxed;
  storeWord(r.expected, uint64_t{0}, relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  storeWord(r.ordinal, ordinal, relaxed);
  storeWord(r.dtype, dtype, relaxed);
  storeWord(r.count, count, relaxed);
  storeRelease(r.expected, sequence);
  ring(*peerControl_);  // a sender asleep waiting for its box to be accepted
  return true;
}

bool Connection::boxAccepted(uint64_t sequence,
                             uint32_t ordinal,
                             uint32_t dtype,
                             uint64_t count) const {
  BoxReceipt& r = outgoing().receipts[(sequence - 1) % kMessageBoxes];
  if (loadAcquire(r.taken) >= sequence)
    return true;
  if (loadAcquire(r.expected) != sequence)
    return false;
  constexpr auto relaxed = std::memory_order_relaxed;
  const uint32_t o = loadWord(r.ordinal, relaxed), d = loadWord(r.dtype, relaxed);
  const uint64_t c = loadWord(r.count, relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  // Rewritten meanwhile (the receiver moved on to a later use): ask again next round.
  if (loadWord(r.expected, relaxed) != sequence)
    return false;
  return o == ordinal && d == dtype && c == count;
}

bool Connection::boxHolds(uint64_t firstSequence, uint32_t ordinal, BoxArrival* out) {
  for (MessageBox& box : incoming().boxes) {
    if (loadAcquire(box.sequence) < firstSequence)
      continue;
    BoxArrival a;
    if (readBox(box, &a) && a.ordinal == ordinal) {
      *out = a;
      return true;
    }
  }
  return false;
}

uint64_t Connection::peerSmallSequence() const {
  Half& in = incoming();
  return std::max(loadAcquire(in.small[0].sequence), loadAcquire(in.small[1].sequence));
}

void Connection::postSmallFailure(uint64_t completedThrough) {
  storeRelease(outgoing().smallFailed, completedThrough + 1);
  ring(*peerControl_);
}

size_t Connection::poll(std::span<Completion> out) {
  size_t n = 0;
  while (n < out.size() && !completions_.empty()) {
    out[n++] = completions_.front();
    completions_.pop();
  }
  if (!failed_ && peerHelloChecked()) {
    n += takeNotices(out.subspan(n));
    if (!failed_)
      n += takeMessages(out.subspan(n));
  }
  if (!failed_)
    checkPeerAlive();
  if (failed_ && !errorReported_ && n < out.size()) {
    errorReported_ = true;
    out[n++] = Completion{0, CompletionKind::kError, Errc::kRemote, 0, 0};
  }
  return n;
}

bool Connection::hasNews() const {
  if (failed_)
    return !errorReported_;
  if (!completions_.empty())
    return true;
  Half& in = incoming();
  auto peek = [](uint64_t& word) {
    return std::atomic_ref<uint64_t>(word).load(std::memory_order_relaxed);
  };
  auto peek32 = [](uint32_t& word) {
    return std::atomic_ref<uint32_t>(word).load(std::memory_order_relaxed);
  };
  // A small exchange not read yet: ours (the caller waits in pollSmall) or one the peer runs
  // while we run something else (the engine's idle round tells). Each is news once: a rank in
  // a chunked call whose peer went on to its next, small call (it sent all this rank needed)
  // would otherwise never sleep until it reads it, and spun on a core its peers needed (4
  // ranks on 2 cores, a 256 KiB reduce after a mailbox barrier: 2-9 ms instead of 0.1).
  const uint64_t posted = std::max(peek(in.small[0].sequence), peek(in.small[1].sequence));
  if (posted > std::max(smallTaken_, smallNewsReported_)) {
    smallNewsReported_ = posted;
    return true;
  }
  if (!smallFailureReported_ && peek(in.smallFailed) != 0) {
    smallFailureReported_ = true;
    return true;
  }
  // A box the peer posted, or one of ours it took or expects (a sender waits for either),
  // each once.
  uint64_t boxes = 0;
  for (size_t b = 0; b < kMessageBoxes; ++b)
    boxes += peek(in.boxes[b].sequence) + peek(outgoing().receipts[b].taken) +
             peek(outgoing().receipts[b].expected);
  if (boxes != boxNewsReported_) {
    boxNewsReported_ = boxes;
    return true;
  }
  return noticeArrived() || (!recvs_.empty() && peek(in.messageTail) != messageHead_) ||
         peek32(in.closed) != 0 || peek32(peerControl_->closed) != 0 ||
         (!peerReady_ && peek32(in.hello.state) != 0);
}

std::string Connection::errorMessage() const {
  return failed_ ? error_ : std::string();
}

}  // namespace gs::transport::shm
