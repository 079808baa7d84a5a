#include "transport/verbs/connection.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "common/error.h"
#include "common/log.h"
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

void modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* state, const std::string& who) {
  const int rc = ibv_modify_qp(qp, &attr, mask);
  GS_CHECK(rc == 0, Errc::kSystem, "verbs %s: cannot move QP 0x%x to %s: %s", who.c_str(),
           qp->qp_num, state, strerror(rc));
}

}  // namespace

Connection::Connection(Device& device, int peer, std::string peerAddress, sockets::Socket side)
    : device_(device),
      peer_(peer),
      peerAddress_(std::move(peerAddress)),
      side_(std::move(side)),
      recvIds_(kMessageDepth),
      counters_(device.port().deviceName, device.port().port) {
  const size_t dataQps = static_cast<size_t>(device.config().ibQpsPerPeer);
  GS_CHECK(dataQps >= 1 && dataQps + 1 <= kMaxQpsPerConnection, Errc::kInvalidArgument,
           "verbs: GS_IB_QPS_PER_PEER=%zu outside [1, %d]", dataQps, kMaxQpsPerConnection - 1);
  const size_t work = 2 * kMessageDepth + dataQps * (kSendDepth + kRecvDepth);
  reserve_ = work + 1;
  completions_ = Ring<Completion>(2 * work + 8);
  cq_.reset(ibv_create_cq(device.port().context.get(), static_cast<int>(work), this,
                          device.channel(), 0));
  GS_CHECK(cq_ != nullptr, Errc::kSystem, "verbs %s: cannot create a CQ of %zu entries: %s",
           device.port().name().c_str(), work, strerror(errno));
  std::random_device random;
  psn_ = random() & 0xffffff;
  qps_.resize(dataQps + 1);
  createQps();  // on a throw the QPs made so far, then the CQ, are destroyed
}

void Connection::createQps() {
  const SelectedPort& port = device_.port();
  for (size_t i = 0; i < qps_.size(); ++i) {
    Qp& q = qps_[i];
    const uint32_t sendDepth = i == 0 ? kMessageDepth : kSendDepth;
    const uint32_t recvDepth = i == 0 ? kMessageDepth : kRecvDepth;
    ibv_qp_init_attr init{};
    init.send_cq = cq_.get();
    init.recv_cq = cq_.get();
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = sendDepth;
    init.cap.max_recv_wr = recvDepth;
    init.cap.max_send_sge = Connection::kMaxSegments;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = kInlineBytes;
    init.qp_context = this;
    q.qp.reset(ibv_create_qp(device_.pd(), &init));
    if (q.qp == nullptr && errno == EINVAL) {
      init.cap.max_inline_data = 0;  // some devices have no inline data
      q.qp.reset(ibv_create_qp(device_.pd(), &init));
    }
    GS_CHECK(q.qp != nullptr, Errc::kSystem, "verbs %s: cannot create an RC QP: %s",
             port.name().c_str(), strerror(errno));
    maxInline_ = i == 0 ? init.cap.max_inline_data : std::min(maxInline_, init.cap.max_inline_data);
    q.sent = Ring<Pending>(sendDepth);

    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = static_cast<uint8_t>(port.port);
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    modify(q.qp.get(), attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
           "INIT", port.name());
    if (i > 0) {
      // Zero-length receives for the immediates of incoming writes; posted before RTR.
      q.toRepost = recvDepth;
      repostReceives(i);
      GS_CHECK(!failed_, Errc::kSystem, "verbs %s: %s", port.name().c_str(), message_.c_str());
    }
  }
}

Connection::~Connection() {
  device_.detach(this);
  qps_.clear();  // the QPs before their CQ
  if (cqEvents_ > 0)
    ibv_ack_cq_events(cq_.get(), cqEvents_);  // every event acknowledged before the CQ goes
}

QpExchange Connection::localInfo(int rank) const {
  const SelectedPort& port = device_.port();
  QpExchange x{};
  x.magic = kQpExchangeMagic;
  x.version = kVerbsWireVersion;
  x.qpCount = static_cast<uint8_t>(qps_.size());
  x.mtu = static_cast<uint8_t>(port.attr.active_mtu);
  x.rank = rank;
  x.peer = peer_;
  std::memcpy(x.gid, port.gid.raw, sizeof(x.gid));
  x.lid = port.attr.lid;
  x.linkLayer = port.ethernet ? 2 : 1;
  x.psn = psn_;
  for (size_t i = 0; i < qps_.size(); ++i)
    x.qpn[i] = qps_[i].qp->qp_num;
  return x;
}

void Connection::activate(const QpExchange& remote) {
  const SelectedPort& port = device_.port();
  const Config& config = device_.config();
  const std::string who = formatString("%s to rank %d", port.name().c_str(), peer_);
  GS_CHECK(remote.magic == kQpExchangeMagic && remote.version == kVerbsWireVersion, Errc::kRemote,
           "verbs %s: the peer sent no valid queue-pair exchange (version %u)", who.c_str(),
           remote.version);
  GS_CHECK(remote.rank == peer_ && remote.peer == device_.rank(), Errc::kRemote,
           "verbs %s: exchange names rank %d -> %d, expected %d -> %d", who.c_str(), remote.rank,
           remote.peer, peer_, device_.rank());
  GS_CHECK(remote.qpCount == qps_.size(), Errc::kInvalidArgument,
           "verbs %s: the peer uses %d data QPs, we use %zu: set the same GS_IB_QPS_PER_PEER on "
           "every rank",
           who.c_str(), remote.qpCount - 1, qps_.size() - 1);
  GS_CHECK(remote.linkLayer == (port.ethernet ? 2 : 1), Errc::kInvalidArgument,
           "verbs %s: link layers differ (peer %s, we %s)", who.c_str(),
           remote.linkLayer == 2 ? "Ethernet" : "InfiniBand",
           port.ethernet ? "Ethernet" : "InfiniBand");
  GS_CHECK(remote.mtu >= IBV_MTU_256 && remote.mtu <= IBV_MTU_4096, Errc::kRemote,
           "verbs %s: invalid path MTU code %u", who.c_str(), remote.mtu);
  for (size_t i = 0; i < qps_.size(); ++i) {
    GS_CHECK(remote.qpn[i] != 0 && remote.qpn[i] < (1u << 24), Errc::kRemote,
             "verbs %s: invalid QP number 0x%x", who.c_str(), remote.qpn[i]);
  }
  mtu_ = std::min(port.attr.active_mtu, static_cast<ibv_mtu>(remote.mtu));
  ibv_gid remoteGid{};
  std::memcpy(remoteGid.raw, remote.gid, sizeof(remote.gid));
  remoteDescription_ = port.ethernet ? gidText(remoteGid)
                                     : formatString("LID %u", static_cast<unsigned>(remote.lid));

  for (size_t i = 0; i < qps_.size(); ++i) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = mtu_;
    attr.dest_qp_num = remote.qpn[i];
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;  // 0.64 ms
    attr.ah_attr.port_num = static_cast<uint8_t>(port.port);
    attr.ah_attr.sl = static_cast<uint8_t>(config.ibServiceLevel);
    attr.ah_attr.dlid = remote.lid;
    if (port.ethernet) {
      // RoCE has no LIDs: every packet carries a GRH, which is what RoCEv2 routes on.
      attr.ah_attr.is_global = 1;
      attr.ah_attr.grh.dgid = remoteGid;
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(port.gidIndex);
      attr.ah_attr.grh.hop_limit = 64;
      attr.ah_attr.grh.traffic_class = static_cast<uint8_t>(config.ibTrafficClass);
    }
    modify(qps_[i].qp.get(), attr,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
           "RTR", who);
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = static_cast<uint8_t>(config.ibTimeout);
    rts.retry_cnt = static_cast<uint8_t>(config.ibRetryCount);
    rts.rnr_retry = 7;  // infinite: a busy receiver reposts its receives soon
    rts.sq_psn = psn_;
    rts.max_rd_atomic = 1;
    modify(qps_[i].qp.get(), rts,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS", who);
  }
}

std::string Connection::describe() const {
  const SelectedPort& port = device_.port();
  static const int mtuBytes[] = {0, 256, 512, 1024, 2048, 4096};
  return formatString("%s GID %s -> rank %d (%s, %s), MTU %d, %zu data QPs + 1, TC %lld SL %lld",
                      port.name().c_str(), port.gidDescription.c_str(), peer_,
                      remoteDescription_.c_str(), peerAddress_.c_str(),
                      mtuBytes[mtu_ >= 1 && mtu_ <= 5 ? mtu_ : 0], qps_.size() - 1,
                      static_cast<long long>(device_.config().ibTrafficClass),
                      static_cast<long long>(device_.config().ibServiceLevel));
}

std::string Connection::qpName(size_t index) const {
  return formatString("%s QP 0x%x (rank %d -> rank %d, %s)", device_.port().name().c_str(),
                      qps_[index].qp->qp_num, device_.rank(), peer_, peerAddress_.c_str());
}

// ---- data path -------------------------------------------------------------------------------

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

std::string Connection::errorMessage() const {
  return message_;
}

void Connection::fail(Errc status, const std::string& why) noexcept {
  if (failed_)
    return;
  failed_ = true;
  status_ = status;
  message_ = why;
  GS_LOG_DEBUG("%s", why.c_str());
  // Tell the peer at once: it sees the side channel close.
  boost::system::error_code ec;
  side_.shutdown(sockets::Socket::shutdown_both, ec);
}

// ---- device support --------------------------------------------------------------------------

void Connection::armCompletionEvents() {
  if (!failed_ && ibv_req_notify_cq(cq_.get(), 0) != 0)
    fail(Errc::kSystem, formatString("verbs %s: ibv_req_notify_cq failed", qpName(0).c_str()));
}

void Connection::appendPollFds(std::vector<pollfd>& fds) const {
  if (!failed_)
    fds.push_back(pollfd{const_cast<sockets::Socket&>(side_).native_handle(), POLLIN, 0});
}

void Connection::checkSide() {
  if (failed_)
    return;
  uint8_t byte;
  const ssize_t n = ::recv(side_.native_handle(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  if (n == 0) {
    fail(Errc::kRemote, formatString("verbs: rank %d (%s) closed the connection (it exited, "
                                     "failed or destroyed its communicator)",
                                     peer_, peerAddress_.c_str()));
  } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    fail(Errc::kRemote, formatString("verbs: connection to rank %d (%s) reset: %s", peer_,
                                     peerAddress_.c_str(), strerror(errno)));
  } else if (n > 0) {
    fail(Errc::kRemote, formatString("verbs: peer rank %d sent unexpected bytes on the control "
                                     "channel",
                                     peer_));
  }
}

bool Connection::ownsQp(const ibv_qp* qp) const {
  for (const Qp& q : qps_) {
    if (q.qp.get() == qp)
      return true;
  }
  return false;
}

}  // namespace gs::transport::verbs
