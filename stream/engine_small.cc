// The small-collective path: ranks whose links offer small-exchange mailboxes (shm) swap one
// block per pair through them: the whole buffer (allreduce, reduce: 2 ranks), the peer's block
// (reduce-scatter, all-to-all) or their own (allgather), and each finishes the call locally,
// reducing in rank order from rank 0's value so replicas agree bit for bit. No plan, chunk
// header, credit or completion: one copy out per peer, one poll loop, one reduction. A 2-rank
// 8 B allreduce took 0.5-0.6 us through the chunk protocol, against ~0.3 us for OpenMPI's
// shared memory; the protocol's bookkeeping was most of it. More than two ranks take it where
// every pair shares memory, for the one-block-per-peer collectives (takesSmallExchange).
//
// Every rank takes this path for the same calls: the choice depends only on what every rank
// passes alike (collective, count, dtype, codec), the rank count, and the links (2 ranks) or
// the communicator's transports (more). Ranks whose calls differ still fail promptly: small
// calls compare tags, and a rank in a chunked call that sees a peer post a small exchange
// while it still expects chunks from it fails in its idle round
// (Engine::Run::checkPeerNotInSmallExchange).
#include <algorithm>
#include <cstring>
#include <optional>
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
  // What the flag alone tells.
  const auto failedBefore = [&] {
    return FailureNotice{
        Errc::kRemote, peer, rank_,
        formatString("rank %d failed before its part of this %u-byte exchange", peer, bytes)};
  };
  // The notice, the connection's error, or nothing yet (the rest of a call that is failing).
  const auto noticeIn = [&](const transport::Completion& c) -> std::optional<FailureNotice> {
    if (c.kind == transport::CompletionKind::kError)
      return FailureNotice{Errc::kRemote, peer, rank_, link.connection().errorMessage()};
    if (c.kind != transport::CompletionKind::kRemoteWrite || immTag(c.imm) != ImmTag::kAbort)
      return std::nullopt;
    link.abortReceived = true;
    if (c.length > 0) {
      if (auto notice = decodeNotice(link.notice(),
                                     std::min<size_t>(c.length, SlotLayout::kNoticeBytes), nranks_))
        return notice;
    }
    return failedBefore();
  };
  // A peer that failed at once may have sent its notice while this rank was still setting the
  // link up, which kept it aside (Link::earlyCompletions): 3 ranks, the peer failing on its
  // folded partner's count before this rank's init returned.
  std::vector<transport::Completion> early;
  early.swap(link.earlyCompletions);
  for (const transport::Completion& c : early) {
    if (auto notice = noticeIn(c))
      return *notice;
  }
  const Deadline until = Deadline::after(std::chrono::milliseconds(200));
  transport::Completion sink[16];
  while (!until.expired()) {
    const size_t n = link.connection().poll(sink);
    for (size_t i = 0; i < n; ++i) {
      if (auto notice = noticeIn(sink[i]))
        return *notice;
    }
    if (n == 0)
      waitForActivity(std::chrono::microseconds(1000));
  }
  return failedBefore();
}

bool Engine::takesSmallExchange(const CollectiveArgs& args) const {
  // count is what one rank sends each peer in each of these (a block; the whole buffer for
  // allreduce and reduce).
  const size_t bytes = args.count * elementSize(args.dtype);
  if (nranks_ < 2 || !symmetricExchange(args) || bytes == 0 || args.codec != nullptr ||
      args.adaptive || args.residual != nullptr || args.count > 0xffff) {
    return false;
  }
  if (nranks_ == 2) {
    Link* link = links_[1 - rank_];
    return bytes <= static_cast<uint64_t>(config_.shmSmallBytes) && link != nullptr &&
           link->connected() && link->connection().smallExchangeBytes() >= bytes;
  }
  // More ranks: the collectives of one block per peer (all-to-all, allgather, reduce-scatter),
  // each rank posting to every peer, so what it writes in all, (n-1) blocks, is what
  // GS_SHM_SMALL_BYTES bounds. Not a reduce (its root alone would wait for all: not symmetric)
  // nor an allreduce: every rank hearing from every other took longer than recursive
  // doubling's log2 n exchanges where ranks outnumber cores (3 and 4 ranks on 2 cores, 96 B:
  // 3.9-4.3 against 2.9-3.2 us, 4.6 against 3.6-5.1), while all-to-all, allgather and
  // reduce-scatter gained (4 ranks: 4.5-5.0 against 4.7-5.3, 4.5-4.7 against 6.9-7.2, 4.7
  // against 5.5-7.2 us). Decided on what every rank knows alike (the call, the rank count, the
  // communicator's transports), never on links that exist here but not yet elsewhere.
  if (!smallGroup_ || args.kind == CollectiveKind::kReduce)
    return false;
  // An allreduce swaps the whole buffer with one partner per round (runSmallAllReduce).
  if (args.kind == CollectiveKind::kAllReduce)
    return bytes <= static_cast<uint64_t>(config_.shmSmallBytes);
  return bytes * static_cast<size_t>(nranks_ - 1) <= static_cast<uint64_t>(config_.shmSmallBytes);
}

void Engine::makeSmallLinks(std::span<const int> peers,
                            const CollectiveArgs& args,
                            uint32_t bytes) {
  // Made now where no schedule made them yet: every rank takes this path for this call, so
  // each pair makes its link together.
  std::vector<int> missing;
  for (int p : peers) {
    if (links_[p] == nullptr)
      missing.push_back(p);
  }
  if (missing.empty())
    return;
  GS_CHECK(linkMaker_, Errc::kInternal, "no connection to rank %d for a small %s", missing.front(),
           collectiveName(args.kind));
  linkMaker_(missing);
  // Links made now are shm like the others (setSmallExchangeGroup); checked once, here.
  for (int p : missing) {
    GS_CHECK(links_[p] != nullptr && links_[p]->connected() &&
                 links_[p]->connection().smallExchangeBytes() >= bytes,
             Errc::kInternal, "the link to rank %d has no %u-byte mailbox", p, bytes);
  }
}

void Engine::postSmallTo(int peer, uint64_t tag, const void* data, uint32_t bytes) {
  Link& link = *links_[peer];
  smallSequences_[static_cast<size_t>(peer)] = ++link.smallSequence;
  link.connection().postSmall(link.smallSequence, tag, data, bytes);
}

void Engine::awaitSmall(std::span<const int> from,
                        const CollectiveArgs& args,
                        uint32_t id,
                        uint64_t tag,
                        uint32_t bytes,
                        uint64_t startNs) {
  // As Run::raise: the peers are told, and the error names the rank at fault.
  const auto raise = [&](const FailureNotice& notice, int peer) {
    raiseNotice(args.kind, id, notice, peer);
  };
  const auto failWith = [&](Errc code, int blamed, const std::string& cause) {
    raise(FailureNotice{code, blamed, rank_, cause}, blamed);
  };
  const auto begin = Clock::time_point(std::chrono::nanoseconds(startNs));
  const auto timeout = std::chrono::milliseconds(config_.timeoutMs);
  size_t pending = from.size();
  size_t next = 0;  // from[next] is the first peer whose block may still be missing
  // The clock is read once in 64 polls (a poll is a few ns while the peers are on their cores),
  // or at every poll where ranks outnumber cores: there each idle poll gives the core away
  // (yieldAfter_ 0), and 64 polls spinning first held the core the peer needed.
  const uint32_t clockEvery = yieldAfter_.count() == 0 ? 1 : 64;
  for (uint32_t polls = 1; pending > 0; ++polls) {
    // A peer's failure is raised after the round: a mismatch this rank finds in another
    // peer's mailbox is the cause itself (more than two ranks: the peer that failed may only
    // have found the same mismatch, and its notice may not come in time).
    int failedPeer = -1;
    for (size_t i = next; i < from.size(); ++i) {
      const int peer = from[i];
      transport::SmallArrival& arrival = smallArrivals_[static_cast<size_t>(peer)];
      if (arrival.data != nullptr)
        continue;
      Link& link = *links_[peer];
      const transport::SmallPoll state =
          link.connection().pollSmall(smallSequences_[static_cast<size_t>(peer)], &arrival);
      if (state == transport::SmallPoll::kFailed)
        failWith(Errc::kRemote, peer, link.connection().errorMessage());
      if (arrival.data != nullptr && (arrival.tag != tag || arrival.bytes != bytes)) {
        failWith(Errc::kInvalidArgument, peer,
                 arrival.bytes != bytes && arrival.tag == tag
                     ? formatString("rank %d sent %u bytes to a %u-byte %s", peer, arrival.bytes,
                                    bytes, collectiveName(args.kind))
                     : tagMismatch(arrival.tag, tag, peer, rank_));
      }
      if (state == transport::SmallPoll::kPeerFailed && failedPeer < 0)
        failedPeer = peer;
      if (state != transport::SmallPoll::kArrived)
        continue;
      --pending;
    }
    if (failedPeer >= 0)
      raise(smallExchangePeerNotice(*links_[failedPeer], bytes), failedPeer);
    while (next < from.size() && smallArrivals_[static_cast<size_t>(from[next])].data != nullptr)
      ++next;
    if (pending == 0)
      break;
    if (abortFlag_.load(std::memory_order_relaxed))
      failWith(Errc::kAborted, rank_, "communicator aborted");
    if (polls % clockEvery != 0)
      continue;
    const auto now = cycle::steadyNow();
    const auto waited = now - begin;
    if (waited > timeout) {
      failWith(Errc::kTimeout, from[next],
               formatString("rank %d sent nothing for this %s (%u bytes) within %lld ms",
                            from[next], collectiveName(args.kind), bytes,
                            static_cast<long long>(config_.timeoutMs)));
    }
    // The chunk protocol's waiting (Run::execute): spin, yield once past yieldAfter_ (ranks
    // outnumbering cores: at once, on the rank's home CPU), sleep on the doorbell once past
    // the spin time.
    if (waited >= spinTime_) {
      waitForActivity(std::chrono::microseconds(1000));
    } else if (waited >= yieldAfter_) {
      stayHome(now);
      std::this_thread::yield();
    }
  }
}

void Engine::runSmall(const CollectiveArgs& args, uint32_t id, uint64_t startNs) {
  if (args.kind == CollectiveKind::kAllReduce)
    return runSmallAllReduce(args, id, startNs);
  lastAlgorithm_ = "small_exchange";
  const size_t esize = elementSize(args.dtype);
  const auto bytes = static_cast<uint32_t>(args.count * esize);
  const auto n = static_cast<size_t>(nranks_);
  const uint64_t tag = smallTag(args, id);
  // Every peer, the next rank first: the ranks' first posts go to different peers.
  smallPeers_.clear();
  for (size_t k = 1; k < n; ++k)
    smallPeers_.push_back(static_cast<int>((static_cast<size_t>(rank_) + k) % n));
  makeSmallLinks(smallPeers_, args, bytes);
  // Blocks of a reduce-scatter's or all-to-all's send buffer, of an allgather's or all-to-all's
  // receive buffer, by rank.
  const auto* send = static_cast<const uint8_t*>(args.send);
  auto* recv = static_cast<uint8_t*>(args.recv);
  const bool blocksOut =
      args.kind == CollectiveKind::kReduceScatter || args.kind == CollectiveKind::kAllToAll;
  const uint8_t* mine = blocksOut ? send + static_cast<size_t>(rank_) * bytes : send;
  smallSequences_.assign(n, 0);
  smallArrivals_.assign(n, transport::SmallArrival{});
  for (int p : smallPeers_)
    postSmallTo(p, tag, blocksOut ? send + static_cast<size_t>(p) * bytes : send, bytes);
  // Waited for in rank order (a timeout names the lowest rank still missing).
  std::sort(smallPeers_.begin(), smallPeers_.end());
  awaitSmall(smallPeers_, args, id, tag, bytes, startNs);
  switch (args.kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll: {
      uint8_t* own = recv + static_cast<size_t>(rank_) * bytes;
      if (own != mine)
        std::memmove(own, mine, bytes);
      for (size_t p = 0; p < n; ++p) {
        if (p != static_cast<size_t>(rank_))
          std::memcpy(recv + p * bytes, smallArrivals_[p].data, bytes);
      }
      break;
    }
    default: {
      if (args.kind == CollectiveKind::kReduce && args.root != rank_)
        break;  // the root's result only
      // In rank order, from rank 0's value: every rank computes op(...op(op(v0, v1), v2)...)
      // element by element alike, so replicas agree bit for bit. This rank's own value is
      // copied aside first where the result overwrites it before its turn (in place, rank > 1).
      const uint8_t* own = mine;
      if (rank_ > 1 && mine == recv) {
        smallScratch_.assign(mine, mine + bytes);
        own = smallScratch_.data();
      }
      const auto value = [&](size_t r) {
        return r == static_cast<size_t>(rank_) ? own : smallArrivals_[r].data;
      };
      codecs::reduceInto(args.dtype, args.op, recv, value(0), value(1), args.count);
      for (size_t r = 2; r < n; ++r)
        codecs::reduceInto(args.dtype, args.op, recv, recv, value(r), args.count);
      codecs::finalizeAverage(args.dtype, args.op, recv, args.count, nranks_);
    }
  }

  countSmall(smallPeers_, bytes, startNs);
}

void Engine::countSmall(std::span<const int> peers, uint32_t bytes, uint64_t startNs) {
  const uint64_t endNs = nowNs();
  stats_.chunksSent = stats_.chunksReceived = peers.size();
  stats_.bytesSent = stats_.bytesLogical = static_cast<uint64_t>(bytes) * peers.size();
  stats_.elapsedNs = elapsedNs(startNs, endNs);
  for (int peer : peers) {
    const auto p = static_cast<size_t>(peer);
    Link& link = *links_[peer];
    link.smallSequenceDone = link.smallSequence;
    link.goodputBytes += bytes;
    link.goodputBusyNs += elapsedNs(startNs, endNs);
    monitoring::LinkCounters* counters = p < counters_.size() ? counters_[p] : nullptr;
    if (counters != nullptr) {
      counters->onChunkSent(bytes, bytes, static_cast<int>(format::CodecId::kRaw));
      counters->onChunkReceived(bytes);
      counters->onChunkCompleted(elapsedNs(startNs, endNs));
      counters->addBusyTime(elapsedNs(startNs, endNs));
    }
  }
}

void Engine::runSmallAllReduce(const CollectiveArgs& args, uint32_t id, uint64_t startNs) {
  lastAlgorithm_ = "small_exchange";
  const auto bytes = static_cast<uint32_t>(args.count * elementSize(args.dtype));
  const uint64_t tag = smallTag(args, id);
  // Recursive doubling through the mailboxes: log2 of the largest power of two p <= n rounds,
  // in round k each rank swapping its partial result with rank ^ 2^k. Ranks p..n-1 first hand
  // their value to rank - p and get the result back at the end (one post each way: the
  // mailboxes' reuse rule holds, each direction of a pair carries one exchange per call).
  int pow2 = 1;
  while (pow2 * 2 <= nranks_)
    pow2 *= 2;
  const int extra = nranks_ - pow2;
  const int folded = rank_ >= pow2 ? rank_ - pow2 : rank_ < extra ? rank_ + pow2 : -1;
  smallPeers_.clear();
  if (folded >= 0)
    smallPeers_.push_back(folded);
  if (rank_ < pow2) {
    for (int mask = 1; mask < pow2; mask <<= 1)
      smallPeers_.push_back(rank_ ^ mask);
  }
  makeSmallLinks(smallPeers_, args, bytes);
  const auto n = static_cast<size_t>(nranks_);
  smallSequences_.assign(n, 0);
  smallArrivals_.assign(n, transport::SmallArrival{});
  const auto* send = static_cast<const uint8_t*>(args.send);
  auto* recv = static_cast<uint8_t*>(args.recv);
  const auto theirs = [&](int peer) { return smallArrivals_[static_cast<size_t>(peer)].data; };
  const auto exchange = [&](int peer) { awaitSmall({&peer, 1}, args, id, tag, bytes, startNs); };
  if (rank_ >= pow2) {
    postSmallTo(folded, tag, send, bytes);
    exchange(folded);
    std::memcpy(recv, theirs(folded), bytes);
  } else {
    // Each combination is op(lower ranks' value, higher ranks' value) on both ranks of a pair,
    // so every rank ends with the same bits.
    const uint8_t* value = send;
    if (folded >= 0) {
      // Its value comes first, our post (the result) at the end: this call's exchange on the
      // pair is the next sequence either way.
      smallSequences_[static_cast<size_t>(folded)] = links_[folded]->smallSequence + 1;
      exchange(folded);
      codecs::reduceInto(args.dtype, args.op, recv, value, theirs(folded), args.count);
      value = recv;
    }
    for (size_t i = folded >= 0 ? 1 : 0; i < smallPeers_.size(); ++i) {
      const int peer = smallPeers_[i];
      postSmallTo(peer, tag, value, bytes);
      exchange(peer);
      if (rank_ < peer)
        codecs::reduceInto(args.dtype, args.op, recv, value, theirs(peer), args.count);
      else
        codecs::reduceInto(args.dtype, args.op, recv, theirs(peer), value, args.count);
      value = recv;
    }
    codecs::finalizeAverage(args.dtype, args.op, recv, args.count, nranks_);
    if (folded >= 0)
      postSmallTo(folded, tag, recv, bytes);
  }
  countSmall(smallPeers_, bytes, startNs);
}

}  // namespace gs::stream

namespace gs::stream {

void Engine::Run::checkPeerNotInSmallExchange() {
  for (const LinkRun& lr : links) {
    Link& link = *lr.link;
    // A peer that sent all this call expects from it may have finished the call and gone on
    // to a small one (more than two ranks: this rank still waits for a third, for its chunks or
    // for what processing the peer's next chunk, already here, depends on).
    if (lr.processed >= lr.queues->recvs.size() ||
        link.arrivedBytes[link.slotOf(lr.recvBase + lr.processed)] != Link::kNotArrived ||
        link.connection().peerSmallSequence() <= link.smallSequence)
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
