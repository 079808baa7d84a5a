// The verbs connection's data path: posting work (writes with immediates, two-sided messages,
// receives) and polling its completions. Every queue is sized at construction (connection.h):
// a full one is kWouldBlock, and a failure is recorded by fail() and reported once by poll(),
// never thrown. Set-up, teardown and the side channel are in connection.cc.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "transport/verbs/connection.h"
#include "transport/verbs/device.h"
#include "transport/verbs/registration.h"

namespace gs::transport::verbs {
namespace {

// wr_id layout: bit 63 set for receives, bits 56..62 the QP index, the rest a sequence number.
constexpr uint64_t kRecvBit = uint64_t{1} << 63;
constexpr uint64_t kSeqMask = (uint64_t{1} << 56) - 1;
uint64_t sendWrId(size_t qp, uint64_t seq) {
  return (static_cast<uint64_t>(qp) << 56) | (seq & kSeqMask);
}
uint64_t recvWrId(size_t qp) {
  return kRecvBit | (static_cast<uint64_t>(qp) << 56);
}
size_t qpOf(uint64_t wrId) {
  return static_cast<size_t>((wrId >> 56) & 0x7f);
}

// Who is at fault for a failed work completion: the peer (it vanished, or sent what we cannot
// accept) or this host.
Errc statusErrc(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_REM_INV_RD_REQ_ERR:
    case IBV_WC_LOC_LEN_ERR:  // receive side: the peer sent more than we posted
    case IBV_WC_RESP_TIMEOUT_ERR:
      return Errc::kRemote;
    default:
      return Errc::kSystem;
  }
}

// Regions come from this device (possibly wrapped: Device::allocateRegion), so the
// registration behind them is a verbs Region.
uint32_t lkeyOf(const MemoryRegion* region) {
  return static_cast<const Region&>(region->registered()).lkey();
}

}  // namespace

bool Connection::push(const Completion& c) {
  return completions_.push(c);
}

PostResult Connection::postOnQp(
    size_t index, ibv_send_wr& wr, WorkId id, CompletionKind kind, size_t bytes, bool mustSignal) {
  Qp& q = qps_[index];
  const bool inlined = bytes > 0 && bytes <= maxInline_;
  // Memory the NIC still reads must not be reported free before a completion says so.
  const bool sourceBusy = bytes > 0 && !inlined;
  const bool signaled = mustSignal || sourceBusy || ++q.sinceSignal >= kSignalEvery;
  if (signaled)
    q.sinceSignal = 0;
  Pending p{id, kind, !(mustSignal || sourceBusy), q.nextSeq};
  wr.wr_id = sendWrId(index, q.nextSeq);
  wr.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (inlined ? IBV_SEND_INLINE : 0);
  wr.next = nullptr;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(q.qp.get(), &wr, &bad);
  if (rc != 0) {
    fail(Errc::kSystem,
         formatString("verbs %s: ibv_post_send failed: %s", qpName(index).c_str(), strerror(rc)));
    return PostResult::kError;
  }
  ++q.nextSeq;
  q.sent.push(p);
  if (p.reported)
    push(Completion{id, kind, Errc::kOk, 0, 0});
  return PostResult::kOk;
}

PostResult Connection::postWrite(std::span<const LocalSegment> segments,
                                 const RemoteKey& dst,
                                 uint64_t dstOffset,
                                 uint32_t imm,
                                 WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (completions_.room() <= reserve_)
    return PostResult::kWouldBlock;
  RemoteTarget target;
  if (segments.size() > kMaxSegments || !parseRemoteKey(dst, &target)) {
    fail(Errc::kInvalidArgument,
         formatString("verbs write to rank %d: %s", peer_,
                      segments.size() > kMaxSegments ? "too many segments" : "not a verbs key"));
    return PostResult::kError;
  }
  ibv_sge sge[kMaxSegments];
  uint64_t bytes = 0;
  int sges = 0;
  for (const LocalSegment& s : segments) {
    if (s.length == 0)
      continue;
    sge[sges].addr = reinterpret_cast<uintptr_t>(s.data());
    sge[sges].length = static_cast<uint32_t>(s.length);
    sge[sges].lkey = lkeyOf(s.region);
    ++sges;
    bytes += s.length;
  }
  if (dstOffset > target.length || bytes > target.length - dstOffset) {
    // A buggy caller; the NIC would refuse it too, but later and less clearly.
    fail(Errc::kInvalidArgument,
         formatString("verbs write to rank %d: %llu bytes at offset %llu overrun the peer's "
                      "region of %llu bytes",
                      peer_, static_cast<unsigned long long>(bytes),
                      static_cast<unsigned long long>(dstOffset),
                      static_cast<unsigned long long>(target.length)));
    return PostResult::kError;
  }
  // Round-robin over the data QPs, skipping full ones.
  const size_t dataQps = qps_.size() - 1;
  for (size_t tries = 0; tries < dataQps; ++tries) {
    const size_t index = nextDataQp_;
    nextDataQp_ = nextDataQp_ % dataQps + 1;
    if (qps_[index].sent.full())
      continue;
    ibv_send_wr wr{};
    wr.sg_list = sges > 0 ? sge : nullptr;
    wr.num_sge = sges;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = target.address + dstOffset;
    wr.wr.rdma.rkey = target.rkey;
    return postOnQp(index, wr, id, CompletionKind::kWrite, bytes, false);
  }
  return PostResult::kWouldBlock;
}

PostResult Connection::postSend(const LocalSegment& segment, WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (completions_.room() <= reserve_ || qps_[0].sent.full())
    return PostResult::kWouldBlock;
  ibv_sge sge{reinterpret_cast<uintptr_t>(segment.data()), static_cast<uint32_t>(segment.length),
              lkeyOf(segment.region)};
  ibv_send_wr wr{};
  wr.sg_list = segment.length > 0 ? &sge : nullptr;
  wr.num_sge = segment.length > 0 ? 1 : 0;
  wr.opcode = IBV_WR_SEND;
  return postOnQp(0, wr, id, CompletionKind::kSend, segment.length, true);
}

PostResult Connection::postRecv(const LocalSegment& segment, WorkId id) {
  if (failed_)
    return PostResult::kError;
  if (recvIds_.full())
    return PostResult::kWouldBlock;
  ibv_sge sge{reinterpret_cast<uintptr_t>(segment.data()), static_cast<uint32_t>(segment.length),
              lkeyOf(segment.region)};
  ibv_recv_wr wr{};
  wr.wr_id = recvWrId(0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_recv(qps_[0].qp.get(), &wr, &bad);
  if (rc != 0) {
    fail(Errc::kSystem,
         formatString("verbs %s: ibv_post_recv failed: %s", qpName(0).c_str(), strerror(rc)));
    return PostResult::kError;
  }
  recvIds_.push(id);
  return PostResult::kOk;
}

void Connection::repostReceives(size_t index) {
  Qp& q = qps_[index];
  constexpr uint32_t kBatch = 32;
  ibv_recv_wr wrs[kBatch];
  while (q.toRepost > 0 && !failed_) {
    const uint32_t n = std::min(q.toRepost, kBatch);
    for (uint32_t i = 0; i < n; ++i) {
      wrs[i] = ibv_recv_wr{};
      wrs[i].wr_id = recvWrId(index);
      wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    const int rc = ibv_post_recv(q.qp.get(), wrs, &bad);
    if (rc != 0) {
      fail(Errc::kSystem,
           formatString("verbs %s: ibv_post_recv failed: %s", qpName(index).c_str(), strerror(rc)));
      return;
    }
    q.toRepost -= n;
  }
}

void Connection::retire(Qp& q, uint64_t seq) {
  // RC completes a send queue in order: a signaled completion retires everything before it.
  while (!q.sent.empty()) {
    const Pending p = q.sent.front();
    q.sent.pop();
    if (!p.reported)
      push(Completion{p.id, p.kind, Errc::kOk, 0, 0});
    if ((p.seq & kSeqMask) == seq)
      return;
  }
}

void Connection::handle(const ibv_wc& wc) {
  const size_t index = qpOf(wc.wr_id);
  if (index >= qps_.size()) {
    fail(Errc::kInternal, formatString("verbs: completion for unknown QP index %zu", index));
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    if (failed_)
      return;  // flushed work after the first error says nothing new
    if (wc.status == IBV_WC_WR_FLUSH_ERR) {
      // Flushed work says the QP is in the error state, not why: the WR that failed may come
      // later in this CQ (receive flushes and the send error share it), or an async event
      // (port down, QP fatal) explains it. drain() decides once the batch is read.
      if (flushedQp_ < 0)
        flushedQp_ = static_cast<int>(index);
      return;
    }
    std::string why = formatString(
        "verbs %s: work completion error: %s (status %d, vendor error "
        "0x%x)",
        qpName(index).c_str(), ibv_wc_status_str(wc.status), wc.status, wc.vendor_err);
    // A well-formed receive fails locally only when the message overran it (rxe reports a
    // local QP operation error, hardware a local length error): the peer's fault.
    const bool overrun = index == 0 && (wc.wr_id & kRecvBit) &&
                         (wc.status == IBV_WC_LOC_LEN_ERR || wc.status == IBV_WC_LOC_QP_OP_ERR);
    if (overrun)
      why += formatString("; peer rank %d sent a message longer than the posted receive buffer",
                          peer_);
    if (wc.status == IBV_WC_RETRY_EXC_ERR)
      why += formatString("; rank %d stopped answering", peer_);
    fail(overrun ? Errc::kRemote : statusErrc(wc.status), why);
    return;
  }
  if (wc.wr_id & kRecvBit) {
    if (index == 0) {
      if (recvIds_.empty() || wc.opcode != IBV_WC_RECV) {
        fail(Errc::kRemote, formatString("verbs %s: unexpected message", qpName(0).c_str()));
        return;
      }
      push(Completion{recvIds_.front(), CompletionKind::kRecv, Errc::kOk, 0, wc.byte_len});
      recvIds_.pop();
      return;
    }
    if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM)) {
      fail(Errc::kRemote, formatString("verbs %s: peer rank %d sent an invalid message (opcode %d)",
                                       qpName(index).c_str(), peer_, wc.opcode));
      return;
    }
    push(Completion{0, CompletionKind::kRemoteWrite, Errc::kOk, ntohl(wc.imm_data), wc.byte_len});
    ++qps_[index].toRepost;
    return;
  }
  retire(qps_[index], wc.wr_id & kSeqMask);
}

bool Connection::drain() {
  constexpr int kBatch = 32;
  ibv_wc wcs[kBatch];
  while (!failed_) {
    const int n = ibv_poll_cq(cq_.get(), kBatch, wcs);
    if (n < 0) {
      fail(Errc::kSystem, formatString("verbs %s: ibv_poll_cq failed", qpName(0).c_str()));
      break;
    }
    for (int i = 0; i < n; ++i)
      handle(wcs[i]);
    if (n < kBatch)
      break;
  }
  if (flushedQp_ >= 0 && !failed_) {
    device_.serviceAsyncEvents();
    if (!failed_) {
      fail(Errc::kSystem,
           formatString("verbs %s: work request flushed: the QP entered the error state without "
                        "an error of its own (port or link down?)",
                        qpName(static_cast<size_t>(flushedQp_)).c_str()));
    }
  }
  // Consumed receives go back at once (one chained post per QP), so the peer never waits on
  // receiver-not-ready while this rank is polling.
  for (size_t i = 1; i < qps_.size(); ++i)
    repostReceives(i);
  return !completions_.empty() || (failed_ && !errorReported_);
}

size_t Connection::poll(std::span<Completion> out) {
  if (!failed_) {
    drain();
    if ((++pollCount_ & 127) == 0) {
      checkSide();
      device_.serviceAsyncEvents();
    }
  }
  size_t n = 0;
  while (n < out.size() && !completions_.empty()) {
    out[n++] = completions_.front();
    completions_.pop();
  }
  if (failed_ && !errorReported_ && n < out.size()) {
    out[n++] = Completion{0, CompletionKind::kError, status_, 0, 0};
    errorReported_ = true;
  }
  return n;
}

}  // namespace gs::transport::verbs
