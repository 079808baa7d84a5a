// The verbs connection's set-up and teardown: the CQ and QPs (INIT, receives posted), the
// queue-pair exchange that moves them to RTS, failure (which closes the side channel so the
// peer learns at once) and the side channel's liveness checks. Posting and polling are in
// connection_data_path.cc.
#include "transport/verbs/connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "common/error.h"
#include "common/log.h"
#include "transport/verbs/device.h"

namespace gs::transport::verbs {
namespace {

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

// ---- failure ---------------------------------------------------------------------------------

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
