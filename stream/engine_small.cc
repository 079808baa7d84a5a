// The small-collective path: two ranks whose link offers small-exchange mailboxes (shm) swap
// one block each through them: the whole buffer (allreduce, reduce), the peer's block
// (reduce-scatter, all-to-all) or their own (allgather), and each finishes the call locally,
// reducing the lower rank's value first so replicas agree bit for bit. No plan, chunk header,
// credit or completion: one copy out, one poll loop, one reduction. A 2-rank 8 B allreduce
// took 0.5-0.6 us through the chunk protocol, against ~0.3 us for OpenMPI's shared memory;
// the protocol's bookkeeping was most of it.
//
// Both ranks take this path for the same calls: the choice depends only on what every rank
// passes alike (collective, count, dtype, codec) and on the link. A pair whose calls differ
// still fails promptly on both ranks: mismatched small calls compare tags, and a rank in a
// chunked call that sees its peer post a small exchange fails in its idle round
// (Engine::Run::checkPeerNotInSmallExchange).
#include <algorithm>
#include <cstring>
#include <thread>

#include "codecs/reduce.h"
#include "common/error.h"
#include "stream/engine_run.h"

namespace gs::stream {
namespace {

// What a rank passes to a small collective, packed (the peer's must be the same): call number
// (low 16 bits), collective, dtype, op, root, count (at most 16 KiB of bytes: 16 bits).
constexpr int kIdShift = 48, kKindShift = 40, kDtypeShift = 32, kOpShift = 24, kRootShift = 16;
uint64_t smallTag(const CollectiveArgs& args, uint32_t collectiveId) {
  const uint64_t root = args.kind == CollectiveKind::kReduce ? static_cast<uint64_t>(args.root) : 0;
  return (static_cast<uint64_t>(collectiveId & 0xffff) << kIdShift) |
         (static_cast<uint64_t>(args.kind) << kKindShift) |
         (static_cast<uint64_t>(args.dtype) << kDtypeShift) |
         (static_cast<uint64_t>(args.op) << kOpShift) | ((root & 0xff) << kRootShift) |
         (args.count & 0xffff);
}

// Why the peer's tag differs from ours, in the chunk protocol's words (Run::validateHeader).
std::string tagMismatch(uint64_t theirs, uint64_t ours, int peer, int me) {
  const auto field = [](uint64_t tag, int shift, uint64_t mask) { return (tag >> shift) & mask; };
  const auto differs = [&](int shift, uint64_t mask) {
    return field(theirs, shift, mask) != field(ours, shift, mask);
  };
  if (differs(kKindShift, 0xff)) {
    return formatString(
        "collective differs between ranks: rank %d called %s, rank %d %s", peer,
        collectiveName(static_cast<CollectiveKind>(field(theirs, kKindShift, 0xff))), me,
        collectiveName(static_cast<CollectiveKind>(field(ours, kKindShift, 0xff))));
  }
  if (differs(0, 0xffff)) {
    return formatString("count differs between ranks: rank %d called with %llu, rank %d with %llu",
                        peer, static_cast<unsigned long long>(field(theirs, 0, 0xffff)), me,
                        static_cast<unsigned long long>(field(ours, 0, 0xffff)));
  }
  if (differs(kOpShift, 0xff)) {
    return formatString(
        "reduction op differs between ranks: rank %d called with %s, rank %d with %s", peer,
        reduceOpName(static_cast<ReduceOp>(field(theirs, kOpShift, 0xff))), me,
        reduceOpName(static_cast<ReduceOp>(field(ours, kOpShift, 0xff))));
  }
  if (differs(kDtypeShift, 0xff)) {
    return formatString("dtype differs between ranks: rank %d called with %s, rank %d with %s",
                        peer, dataTypeName(static_cast<DataType>(field(theirs, kDtypeShift, 0xff))),
                        me, dataTypeName(static_cast<DataType>(field(ours, kDtypeShift, 0xff))));
  }
  if (differs(kRootShift, 0xff)) {
    return formatString(
        "root differs between ranks: rank %d called with root %llu, rank %d with %llu", peer,
        static_cast<unsigned long long>(field(theirs, kRootShift, 0xff)), me,
        static_cast<unsigned long long>(field(ours, kRootShift, 0xff)));
  }
  return formatString(
      "ranks are at different calls: rank %d sent collective #%llu, rank %d is at #%llu (a rank "
      "skipped or added a call)",
      peer, static_cast<unsigned long long>(field(theirs, kIdShift, 0xffff)), me,
      static_cast<unsigned long long>(field(ours, kIdShift, 0xffff)));
}

// The collectives whose two ranks each send one block and wait for the other's: a symmetric
// exchange, which the mailboxes' reuse rule needs (broadcast's root would not wait).
bool symmetricExchange(const CollectiveArgs& args) {
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduce:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
      return true;
    case CollectiveKind::kAllToAll:
      return args.layout == nullptr;  // alltoallv's pairs carry counts of their own
    default:
      return false;
  }
}

}  // namespace

// The cause a peer that gave up on a small exchange sent (Engine::notifyPeers: its abort
// message, after the mailbox flag), read briefly off the connection; what the flag alone tells
// when none comes.
FailureNotice Engine::smallExchangePeerNotice(Link& link, uint32_t bytes) {
  const int peer = link.peer();
  const Deadline until = Deadline::after(std::chrono::milliseconds(200));
  transport::Completion sink[16];
  while (!until.expired()) {
    const size_t n = link.connection().poll(sink);
    for (size_t i = 0; i < n; ++i) {
      const transport::Completion& c = sink[i];
      if (c.kind == transport::CompletionKind::kError)
        return FailureNotice{Errc::kRemote, peer, rank_, link.connection().errorMessage()};
      if (c.kind != transport::CompletionKind::kRemoteWrite || immTag(c.imm) != ImmTag::kAbort)
        continue;  // the rest of a call that is failing
      link.abortReceived = true;
      if (c.length > 0) {
        if (auto notice = decodeNotice(
                link.notice(), std::min<size_t>(c.length, SlotLayout::kNoticeBytes), nranks_)) {
          return *notice;
        }
      }
      break;
    }
    if (n == 0)
      waitForActivity(std::chrono::microseconds(1000));
  }
  return FailureNotice{
      Errc::kRemote, peer, rank_,
      formatString("rank %d failed before its part of this %u-byte exchange", peer, bytes)};
}

Link* Engine::smallExchangeLink(const CollectiveArgs& args) const {
  // count is what one rank sends its peer in each of these (a block; the whole buffer for
  // allreduce and reduce).
  const size_t bytes = args.count * elementSize(args.dtype);
  if (nranks_ != 2 || !symmetricExchange(args) || bytes == 0 ||
      bytes > static_cast<uint64_t>(config_.shmSmallBytes) || args.codec != nullptr ||
      args.adaptive || args.residual != nullptr || args.count > 0xffff) {
    return nullptr;
  }
  Link* link = links_[1 - rank_];
  if (link == nullptr || !link->connected() || link->connection().smallExchangeBytes() < bytes)
    return nullptr;
  return link;
}

void Engine::runSmall(const CollectiveArgs& args, Link& link, uint32_t id, uint64_t startNs) {
  lastAlgorithm_ = "small_exchange";
  const size_t esize = elementSize(args.dtype);
  const auto bytes = static_cast<uint32_t>(args.count * esize);
  const int peer = link.peer();
  const uint64_t sequence = ++link.smallSequence;
  const uint64_t tag = smallTag(args, id);
  transport::Connection& connection = link.connection();
  // Blocks of a reduce-scatter's or all-to-all's send buffer, of an allgather's or all-to-all's
  // receive buffer, by rank.
  const auto* send = static_cast<const uint8_t*>(args.send);
  auto* recv = static_cast<uint8_t*>(args.recv);
  const bool blocksOut =
      args.kind == CollectiveKind::kReduceScatter || args.kind == CollectiveKind::kAllToAll;
  const uint8_t* mine = blocksOut ? send + static_cast<size_t>(rank_) * bytes : send;
  connection.postSmall(sequence, tag, blocksOut ? send + static_cast<size_t>(peer) * bytes : send,
                       bytes);

  // As Run::raise: the peers are told, and the error names the rank at fault.
  const auto raise = [&](const FailureNotice& notice) { raiseNotice(args.kind, id, notice, peer); };
  const auto failWith = [&](Errc code, int blamed, const std::string& cause) {
    raise(FailureNotice{code, blamed, rank_, cause});
  };
  const auto begin = Clock::time_point(std::chrono::nanoseconds(startNs));
  const auto timeout = std::chrono::milliseconds(config_.timeoutMs);
  transport::SmallArrival arrival;
  // The clock is read once in 64 polls (a poll is a few ns while the peer is on its core).
  for (uint32_t polls = 1;; ++polls) {
    const transport::SmallPoll state = connection.pollSmall(sequence, &arrival);
    if (state == transport::SmallPoll::kArrived)
      break;
    if (state == transport::SmallPoll::kPeerFailed)
      raise(smallExchangePeerNotice(link, bytes));
    if (state == transport::SmallPoll::kFailed)
      failWith(Errc::kRemote, peer, connection.errorMessage());
    if (abortFlag_.load(std::memory_order_relaxed))
      failWith(Errc::kAborted, rank_, "communicator aborted");
    if (polls % 64 != 0)
      continue;
    const auto waited = Clock::now() - begin;
    if (waited > timeout) {
      failWith(Errc::kTimeout, peer,
               formatString("rank %d sent nothing for this %s (%u bytes) within %lld ms", peer,
                            collectiveName(args.kind), bytes,
                            static_cast<long long>(config_.timeoutMs)));
    }
    // The chunk protocol's waiting (Run::execute): spin, yield once past yieldAfter_ (ranks
    // outnumbering cores: at once), sleep on the doorbell once past the spin time.
    if (waited >= spinTime_)
      waitForActivity(std::chrono::microseconds(1000));
    else if (waited >= yieldAfter_)
      std::this_thread::yield();
  }
  if (arrival.tag != tag || arrival.bytes != bytes) {
    failWith(Errc::kInvalidArgument, peer,
             arrival.bytes != bytes && arrival.tag == tag
                 ? formatString("rank %d sent %u bytes to a %u-byte %s", peer, arrival.bytes, bytes,
                                collectiveName(args.kind))
                 : tagMismatch(arrival.tag, tag, peer, rank_));
  }
  switch (args.kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll: {
      uint8_t* own = recv + static_cast<size_t>(rank_) * bytes;
      if (own != mine)
        std::memmove(own, mine, bytes);
      std::memcpy(recv + static_cast<size_t>(peer) * bytes, arrival.data, bytes);
      break;
    }
    default: {
      if (args.kind == CollectiveKind::kReduce && args.root != rank_)
        break;  // the root's result only
      // Lower rank's value first: both ranks compute op(v0, v1) element by element alike.
      const void* first = rank_ < peer ? mine : arrival.data;
      const void* second = rank_ < peer ? arrival.data : mine;
      codecs::reduceInto(args.dtype, args.op, recv, first, second, args.count);
      codecs::finalizeAverage(args.dtype, args.op, recv, args.count, nranks_);
    }
  }

  const uint64_t endNs = nowNs();
  stats_.chunksSent = stats_.chunksReceived = 1;
  stats_.bytesSent = stats_.bytesLogical = bytes;
  stats_.elapsedNs = endNs - startNs;
  link.goodputBytes += bytes;
  link.goodputBusyNs += endNs - startNs;
  monitoring::LinkCounters* counters =
      static_cast<size_t>(peer) < counters_.size() ? counters_[peer] : nullptr;
  if (counters != nullptr) {
    counters->onChunkSent(bytes, bytes, static_cast<int>(format::CodecId::kRaw));
    counters->onChunkReceived(bytes);
    counters->onChunkCompleted(endNs - startNs);
    counters->addBusyTime(endNs - startNs);
  }
}

}  // namespace gs::stream

namespace gs::stream {

void Engine::Run::checkPeerNotInSmallExchange() {
  for (const LinkRun& lr : links) {
    Link& link = *lr.link;
    if (link.connection().peerSmallSequence() <= link.smallSequence)
      continue;
    // The peer posted its small exchange after every chunk of its previous call: once a round
    // polled after we saw it made no progress either, nothing of this call is coming.
    if (++peerInSmallRounds < 2)
      return;
    fail(Errc::kInvalidArgument, link.peer(),
         formatString("calls differ between ranks: rank %d is in a small collective (at most "
                      "%lld bytes, GS_SHM_SMALL_BYTES), rank %d in %s of %zu elements",
                      link.peer(), static_cast<long long>(engine.config_.shmSmallBytes),
                      engine.rank_, collectiveName(args.kind), args.count));
  }
}

}  // namespace gs::stream
