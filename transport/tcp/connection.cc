#include "transport/tcp/connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "transport/tcp/device.h"

namespace gs::transport::tcp {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

// Buffers gathered into one writev. Asio passes at most 64 to the kernel per call.
constexpr size_t kMaxIov = 64;
// Work bounds per socket per poll(): enough to keep a link busy, small enough that one busy
// socket cannot starve the others or the caller.
constexpr int kWritesPerPoll = 4;
constexpr int kReadsPerPoll = 16;
// Room for incoming frames beyond our own ops and posted receives.
constexpr size_t kExtraCompletions = 256;
// In a post batch, frames up to this size wait for the batch's end and share a socket with its
// other small frames, up to kBatchedQueueBytes queued there; larger ones leave at once, spread
// over the sockets for bandwidth.
constexpr size_t kBatchedFrameBytes = 16 << 10;
constexpr size_t kBatchedQueueBytes = 64 << 10;

bool wouldBlock(const error_code& ec) {
  return ec == asio::error::would_block || ec == asio::error::try_again;
}

}  // namespace

Connection::Connection(Device& device,
                       int peer,
                       std::string peerAddress,
                       std::vector<sockets::Socket> established,
                       std::shared_ptr<RegionTable> regions)
    : device_(device),
      peer_(peer),
      peerAddress_(std::move(peerAddress)),
      regions_(std::move(regions)),
      completions_(established.size() * kOpsPerSocket + kMaxPostedRecvs + kExtraCompletions),
      recvs_(kMaxPostedRecvs) {
  for (sockets::Socket& s : established) {
    auto ch = std::make_unique<Channel>(std::move(s));
    ch->fd.store(ch->socket.native_handle());
    channels_.push_back(std::move(ch));
  }
  for (auto& ch : channels_)
    updateEvents(*ch);
  device_.attach(this);
}

Connection::~Connection() {
  device_.detach(this);
  for (auto& ch : channels_) {
    error_code ec;
    ch->fd.store(-1);
    ch->socket.close(ec);
  }
}

void Connection::fail(Errc status, std::string message) {
  if (failed_)
    return;
  failed_ = true;
  failStatus_ = status;
  error_ = std::move(message);
  GS_LOG_DEBUG("tcp: %s", error_.c_str());
  // Close every socket so the peer learns at once, and stop waiting on them.
  for (auto& ch : channels_) {
    error_code ec;
    ch->fd.store(-1);
    ch->events.store(0);
    ch->socket.close(ec);
  }
}

void Connection::failIo(const error_code& ec) {
  if (ec == asio::error::eof) {
    fail(Errc::kRemote,
         formatString("connection to rank %d (%s) closed by peer", peer_, peerAddress_.c_str()));
  } else if (ec == asio::error::connection_reset || ec == asio::error::broken_pipe) {
    fail(Errc::kRemote,
         formatString("connection to rank %d (%s) reset by peer", peer_, peerAddress_.c_str()));
  } else {
    fail(Errc::kRemote, formatString("connection to rank %d (%s) failed: %s", peer_,
                                     peerAddress_.c_str(), ec.message().c_str()));
  }
}

void Connection::closeChannel(Channel& ch) {
  ch.closedByPeer = true;
  for (const auto& other : channels_) {
    if (!other->closedByPeer)
      return;
  }
  failIo(asio::error::eof);
}

Connection::Channel* Connection::chooseChannel(const SendOp& op) {
  const size_t n = channels_.size();
  if (batching_ && op.total <= kBatchedFrameBytes) {
    // A small frame joins the small frames this batch already queued: one writev carries them
    // all, and the peer reads them in one pass over one socket.
    for (size_t k = 0; k < n; ++k) {
      Channel& ch = *channels_[k];
      if (ch.unwritten < ch.ops.size() && !ch.ops.full() && !ch.closedByPeer &&
          ch.queuedBytes + op.total <= kBatchedQueueBytes) {
        return &ch;
      }
    }
  }
  // Least-loaded socket with room; equal loads rotate so small messages spread too.
  Channel* best = nullptr;
  for (size_t k = 0; k < n; ++k) {
    Channel& ch = *channels_[(nextChannel_ + k) % n];
    if (ch.ops.full() || ch.closedByPeer)
      continue;
    if (!best || ch.queuedBytes < best->queuedBytes)
      best = &ch;
  }
  if (best != nullptr)
    nextChannel_ = (nextChannel_ + 1) % n;
  return best;
}

PostResult Connection::enqueue(const SendOp& op) {
  Channel* ch = chooseChannel(op);
  if (ch == nullptr)
    return PostResult::kWouldBlock;
  ch->ops.push(op);
  ch->queuedBytes += op.total;
  if (batching_ && op.total <= kBatchedFrameBytes)
    return PostResult::kOk;  // endPostBatch (or the next poll) writes it
  if (gathering_) {
    ch->gathered = true;  // endGather (or the next poll) writes it with the gather's others
    return PostResult::kOk;
  }
  // Write eagerly: a message leaves now instead of at the next poll. A large one does in a
  // batch too: held to the end of a round that reduces other chunks meanwhile, 256 KiB chunks
  // left late enough to cost a third of a 2-rank 16 MiB allreduce's bandwidth.
  flush(*ch);
  if (failed_)
    return PostResult::kError;
  updateEvents(*ch);
  return PostResult::kOk;
}

void Connection::endPostBatch() {
  batching_ = false;
  flushHeld(false);
}

void Connection::endGather() {
  gathering_ = false;
  // Only the sockets the gather used: small frames a batch holds elsewhere wait for its end.
  flushHeld(true);
}

void Connection::flushHeld(bool gatheredOnly) {
  for (auto& ch : channels_) {
    if (failed_)
      return;
    if (gatheredOnly && !ch->gathered)
      continue;
    ch->gathered = false;
    if (ch->unwritten < ch->ops.size()) {
      flush(*ch);
      if (!failed_)
        updateEvents(*ch);
    }
  }
}

PostResult Connection::postWrite(std::span<const LocalSegment> segments,
                                 const RemoteKey& dst,
                                 uint64_t dstOffset,
                                 uint32_t imm,
                                 WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (segments.size() > kMaxSegments) {
    fail(Errc::kInvalidArgument, formatString("postWrite to rank %d with %zu segments (at most "
                                              "%zu)",
                                              peer_, segments.size(), kMaxSegments));
    return PostResult::kError;
  }
  SendOp op;
  op.id = id;
  op.kind = CompletionKind::kWrite;
  uint64_t payload = 0;
  for (const LocalSegment& s : segments) {
    op.segData[op.segments] = s.length ? s.data() : nullptr;
    op.segLen[op.segments] = s.length;
    ++op.segments;
    payload += s.length;
  }
  if (payload > kMaxFrameBytes) {
    fail(Errc::kInvalidArgument,
         formatString("postWrite of %llu bytes to rank %d exceeds the "
                      "tcp limit of %u",
                      static_cast<unsigned long long>(payload), peer_, kMaxFrameBytes));
    return PostResult::kError;
  }
  op.header =
      FrameHeader{static_cast<uint8_t>(FrameType::kWrite), {},       imm, RegionTable::idOf(dst),
                  static_cast<uint32_t>(payload),          dstOffset};
  op.total = sizeof(FrameHeader) + payload;
  return enqueue(op);
}

PostResult Connection::postSend(const LocalSegment& segment, WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (segment.length > kMaxFrameBytes) {
    fail(Errc::kInvalidArgument, formatString("postSend of %zu bytes to rank %d exceeds the tcp "
                                              "limit of %u",
                                              segment.length, peer_, kMaxFrameBytes));
    return PostResult::kError;
  }
  SendOp op;
  op.id = id;
  op.kind = CompletionKind::kSend;
  op.segments = 1;
  op.segData[0] = segment.length ? segment.data() : nullptr;
  op.segLen[0] = segment.length;
  op.header = FrameHeader{static_cast<uint8_t>(FrameType::kSend), {}, 0, 0,
                          static_cast<uint32_t>(segment.length),  0};
  op.total = sizeof(FrameHeader) + segment.length;
  return enqueue(op);
}

PostResult Connection::postRecv(const LocalSegment& segment, WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (!recvs_.push(PostedRecv{const_cast<uint8_t*>(segment.data()), segment.length, id})) {
    return PostResult::kWouldBlock;
  }
  return PostResult::kOk;
}

void Connection::retire(Channel& ch) {
  while (ch.unwritten > 0 && !completions_.full()) {
    SendOp& op = ch.ops.front();
    completions_.push(Completion{op.id, op.kind, Errc::kOk, 0,
                                 static_cast<uint32_t>(op.total - sizeof(FrameHeader))});
    ch.queuedBytes -= op.total;
    ch.ops.pop();
    --ch.unwritten;
  }
}

void Connection::flush(Channel& ch) {
  retire(ch);
  std::array<asio::const_buffer, kMaxIov> bufs;
  for (int round = 0; round < kWritesPerPoll && ch.unwritten < ch.ops.size(); ++round) {
    size_t nb = 0;
    size_t gathered = 0;
    for (size_t i = ch.unwritten; i < ch.ops.size() && nb + 1 + kMaxSegments <= kMaxIov; ++i) {
      SendOp& op = ch.ops.at(i);
      size_t skip = op.written;  // bytes of this op already with the kernel
      auto add = [&](const void* p, size_t len) {
        if (len <= skip) {
          skip -= len;
          return;
        }
        bufs[nb++] = asio::const_buffer(static_cast<const uint8_t*>(p) + skip, len - skip);
        gathered += len - skip;
        skip = 0;
      };
      add(&op.header, sizeof(FrameHeader));
      for (uint8_t s = 0; s < op.segments; ++s)
        add(op.segData[s], op.segLen[s]);
    }
    error_code ec;
    size_t n = ch.socket.write_some(std::span<const asio::const_buffer>(bufs.data(), nb), ec);
    if (wouldBlock(ec))
      break;
    if (ec) {
      failIo(ec);
      return;
    }
    for (size_t left = n; left > 0 && ch.unwritten < ch.ops.size();) {
      SendOp& op = ch.ops.at(ch.unwritten);
      size_t take = std::min(left, op.total - op.written);
      op.written += take;
      left -= take;
      if (op.written == op.total)
        ++ch.unwritten;
    }
    if (n < gathered)
      break;  // the socket buffer is full
  }
  retire(ch);
}

bool Connection::startFrame(Channel& ch) {
  const FrameHeader h = ch.header;
  if (h.reserved[0] | h.reserved[1] | h.reserved[2]) {
    fail(Errc::kRemote, formatString("peer rank %d sent an invalid frame: reserved bytes are "
                                     "not zero",
                                     peer_));
    return false;
  }
  if (h.length > kMaxFrameBytes) {
    fail(Errc::kRemote, formatString("peer rank %d sent an invalid frame: length %u exceeds "
                                     "the limit of %u",
                                     peer_, h.length, kMaxFrameBytes));
    return false;
  }
  if (h.type == static_cast<uint8_t>(FrameType::kSend)) {
    ch.sendLength = h.length;
    ch.state = RecvState::kWaitRecv;
    return recvs_.empty() || startSend(ch);
  }
  if (h.type != static_cast<uint8_t>(FrameType::kWrite)) {
    fail(Errc::kRemote,
         formatString("peer rank %d sent an invalid frame: unknown type %u", peer_, h.type));
    return false;
  }
  RegionTable::Entry region;
  if (!regions_->find(h.regionId, &region)) {
    fail(Errc::kRemote, formatString("peer rank %d sent an invalid frame: region id %u is not "
                                     "registered",
                                     peer_, h.regionId));
    return false;
  }
  if (h.offset > region.size || h.length > region.size - h.offset) {
    fail(Errc::kRemote, formatString("peer rank %d sent an invalid frame: %u bytes at offset "
                                     "%llu are outside region %u of %zu bytes",
                                     peer_, h.length, static_cast<unsigned long long>(h.offset),
                                     h.regionId, region.size));
    return false;
  }
  ch.payloadAt = region.data + h.offset;
  ch.payloadLeft = h.length;
  ch.nextLeft = 0;
  ch.landedFrom = nullptr;
  ch.landing = Completion{0, CompletionKind::kRemoteWrite, Errc::kOk, h.imm, h.length};
  for (size_t i = 0; i < landings_.size(); ++i) {
    const Landing l = landings_[i];
    if (l.slot != ch.payloadAt)
      continue;
    landings_[i] = landings_.back();
    landings_.pop_back();
    if (h.length == static_cast<uint64_t>(l.keep) + l.bytes && l.bytes > 0) {
      ch.payloadLeft = l.keep;
      ch.keep = l.keep;
      ch.expect = l.expect;
      ch.nextAt = l.dst;
      ch.nextLeft = l.bytes;
      ch.slotNext = l.slot + l.keep;
    }
    break;
  }
  ch.state = RecvState::kPayload;
  return true;
}

void Connection::landAt(uint8_t* slot,
                        std::span<const uint8_t> expect,
                        uint8_t* dst,
                        uint32_t bytes) {
  Landing next{
      slot, static_cast<uint32_t>(std::min(expect.size(), kMaxLandingPrefix)), {}, dst, bytes};
  std::memcpy(next.expect.data(), expect.data(), next.keep);
  for (Landing& l : landings_) {
    if (l.slot == slot) {
      l = next;
      return;
    }
  }
  landings_.push_back(next);
}

void Connection::clearLandings() {
  landings_.clear();
  // A payload on its way to a landing's dst goes on into its slot (the rest of it; what came
  // before is in dst): dst is the caller's again.
  for (auto& ch : channels_) {
    if (ch->state != RecvState::kPayload)
      continue;
    if (ch->landedFrom != nullptr) {
      ch->payloadAt = ch->slotNext + (ch->payloadAt - ch->landedFrom);
      ch->landedFrom = nullptr;
      ch->landing.id = 0;
    } else if (ch->nextLeft > 0) {
      ch->nextAt = ch->slotNext;  // the rest goes to the slot whatever its first bytes say
    }
  }
}

bool Connection::startSend(Channel& ch) {
  PostedRecv recv = recvs_.front();
  if (ch.sendLength > recv.length) {
    fail(Errc::kRemote, formatString("peer rank %d sent an invalid frame: send of %u bytes "
                                     "exceeds the posted receive buffer of %zu",
                                     peer_, ch.sendLength, recv.length));
    return false;
  }
  recvs_.pop();
  ch.payloadAt = recv.data;
  ch.payloadLeft = ch.sendLength;
  ch.landing = Completion{recv.id, CompletionKind::kRecv, Errc::kOk, 0, ch.sendLength};
  ch.state = RecvState::kPayload;
  return true;
}

bool Connection::consumeAhead(Channel& ch) {
  for (;;) {
    if (failed_)
      return false;
    if (ch.state == RecvState::kWaitRecv) {
      if (recvs_.empty() || !startSend(ch))
        return false;
      continue;
    }
    const size_t ahead = ch.aheadEnd - ch.aheadBegin;
    if (ch.state == RecvState::kPayload) {
      if (ch.payloadLeft == 0 && ch.nextLeft > 0) {
        // The first bytes of a write that may land in place are in its slot: the rest goes to
        // the landing's dst only if they are what the receiver expects.
        const bool lands = ch.nextAt != ch.slotNext &&
                           std::memcmp(ch.slotNext - ch.keep, ch.expect.data(), ch.keep) == 0;
        ch.landedFrom = lands ? ch.nextAt : nullptr;
        ch.landing.id = lands ? kLandedInPlace : 0;
        ch.payloadAt = lands ? ch.nextAt : ch.slotNext;
        ch.payloadLeft = ch.nextLeft;
        ch.nextLeft = 0;
        continue;
      }
      if (ch.payloadLeft == 0) {
        ch.landedFrom = nullptr;
        if (completions_.full())
          return false;  // resume when the caller has polled
        completions_.push(ch.landing);
        ch.state = RecvState::kHeader;
        continue;
      }
      if (ahead == 0)
        return true;
      const size_t take = std::min(ahead, ch.payloadLeft);
      std::memcpy(ch.payloadAt, ch.ahead.get() + ch.aheadBegin, take);
      ch.payloadAt += take;
      ch.payloadLeft -= take;
      ch.aheadBegin += take;
      continue;
    }
    if (ahead < sizeof(FrameHeader))
      return true;
    std::memcpy(&ch.header, ch.ahead.get() + ch.aheadBegin, sizeof(FrameHeader));
    ch.aheadBegin += sizeof(FrameHeader);
    if (!startFrame(ch))
      return false;
  }
}

void Connection::receive(Channel& ch) {
  // Each read takes what the socket holds: the rest of a payload straight into its target, and
  // behind it (or alone, between frames) up to kReadAheadBytes more, from which the following
  // frames' headers and small payloads are taken without another system call. Small frames
  // sent together (a message's data and its receive notice) then cost the receiver one read.
  for (int reads = 0;; ++reads) {
    if (!consumeAhead(ch) || reads == kReadsPerPoll)
      return;
    if (ch.aheadBegin > 0) {  // keep a partial header, start the buffer over
      std::memmove(ch.ahead.get(), ch.ahead.get() + ch.aheadBegin, ch.aheadEnd - ch.aheadBegin);
      ch.aheadEnd -= ch.aheadBegin;
      ch.aheadBegin = 0;
    }
    if (!ch.mayHaveData)
      return;
    const size_t direct = ch.state == RecvState::kPayload ? ch.payloadLeft : 0;
    const size_t asked = direct + (kReadAheadBytes - ch.aheadEnd);
    std::array<asio::mutable_buffer, 2> bufs{
        asio::buffer(ch.payloadAt, direct),
        asio::buffer(ch.ahead.get() + ch.aheadEnd, kReadAheadBytes - ch.aheadEnd)};
    error_code ec;
    const size_t n = direct > 0 ? ch.socket.read_some(bufs, ec) : ch.socket.read_some(bufs[1], ec);
    if (wouldBlock(ec))
      return;
    if (ec == asio::error::eof && ch.state == RecvState::kHeader && ch.aheadEnd == 0) {
      closeChannel(ch);
      return;
    }
    if (ec) {
      failIo(ec);
      return;
    }
    const size_t landed = std::min(n, direct);
    ch.payloadAt += landed;
    ch.payloadLeft -= landed;
    ch.aheadEnd += n - landed;
    // A short read emptied the socket: another would only say so (a system call per socket
    // and poll, most of a small message's cost where ranks outnumber cores).
    if (n < asked)
      ch.mayHaveData = false;
  }
}

void Connection::updateEvents(Channel& ch) {
  short ev = 0;
  bool blocked = completions_.full() || (ch.state == RecvState::kWaitRecv && recvs_.empty()) ||
                 ch.closedByPeer;
  if (!blocked)
    ev |= POLLIN;
  if (ch.unwritten < ch.ops.size())
    ev |= POLLOUT;
  ch.events.store(ev, std::memory_order_relaxed);
}

size_t Connection::poll(std::span<Completion> out) {
  if (!failed_) {
    for (auto& ch : channels_) {
      if (failed_)
        break;
      flush(*ch);
      if (!failed_ && !ch->closedByPeer)
        receive(*ch);
    }
  }
  size_t n = 0;
  while (n < out.size() && !completions_.empty()) {
    out[n++] = completions_.front();
    completions_.pop();
  }
  if (failed_) {
    if (!errorReported_ && n < out.size()) {
      errorReported_ = true;
      out[n++] = Completion{0, CompletionKind::kError, failStatus_, 0, 0};
    }
  } else {
    // Finished writes may be waiting for completion-queue room freed just now.
    for (auto& ch : channels_) {
      retire(*ch);
      updateEvents(*ch);
    }
  }
  for (auto& ch : channels_)
    ch->mayHaveData = true;  // a later poll without a readiness check reads every socket
  return n;
}

void Connection::appendReadinessFds(std::vector<pollfd>& fds) const {
  for (const auto& ch : channels_) {
    const int fd = ch->fd.load(std::memory_order_relaxed);
    if (fd >= 0 && !ch->closedByPeer)
      fds.push_back(pollfd{fd, POLLIN, 0});
  }
}

void Connection::takeReadiness(std::span<const pollfd> fds) {
  // The entries appendReadinessFds made, in its order (no poll() ran in between to close a
  // socket); matched by descriptor all the same.
  size_t at = 0;
  for (auto& ch : channels_) {
    const int fd = ch->fd.load(std::memory_order_relaxed);
    if (fd < 0 || ch->closedByPeer)
      continue;
    while (at < fds.size() && fds[at].fd != fd)
      ++at;
    if (at == fds.size())
      return;
    ch->mayHaveData = fds[at].revents != 0;
  }
}

std::string Connection::errorMessage() const {
  return failed_ ? error_ : std::string();
}

void Connection::appendPollFds(std::vector<pollfd>& fds) const {
  for (const auto& ch : channels_) {
    int fd = ch->fd.load(std::memory_order_relaxed);
    if (fd >= 0)
      fds.push_back(pollfd{fd, ch->events.load(std::memory_order_relaxed), 0});
  }
}

bool Connection::linkInfo(transport::LinkInfo* out) const {
  transport::LinkInfo info;
  bool any = false;
  for (const auto& ch : channels_) {
    const int fd = ch->fd.load(std::memory_order_relaxed);
    if (fd < 0)
      continue;
    tcp_info ti{};
    socklen_t len = sizeof(ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
      continue;
    any = true;
    // tcpi_rtt / tcpi_rttvar are in microseconds (tcp(7)); the socket with the longest queue
    // speaks for the link.
    if (ti.tcpi_rtt * 1e-6 > info.rttSeconds) {
      info.rttSeconds = ti.tcpi_rtt * 1e-6;
      info.rttVarSeconds = ti.tcpi_rttvar * 1e-6;
    }
    info.retransmits += ti.tcpi_total_retrans;
    info.cwndBytes += static_cast<uint64_t>(ti.tcpi_snd_cwnd) * ti.tcpi_snd_mss;
  }
  if (any)
    *out = info;
  return any;
}

}  // namespace gs::transport::tcp
