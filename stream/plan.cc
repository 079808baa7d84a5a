#include "stream/plan.h"

#include <algorithm>
#include <cstdint>

#include "common/error.h"

namespace gs::stream {
namespace {

struct Interval {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const Interval& o) const { return begin < o.end && o.begin < end; }
  bool empty() const { return begin >= end; }
};

// Whether the rank receiving this step's send keeps the elements as they are (a copy) rather
// than reducing them. Gathers, broadcasts and all-to-all only copy; reductions copy in their
// gathering phases, whose steps copy on both ends of a link (pairwise halving-doubling, and a
// ring where every rank runs the same step kinds). A hint for the single copy (SendOp): a
// wrong guess costs speed, never correctness.
// Broadcast only between two ranks: along a longer chain every hop waits for the next rank's
// copy before its chunk's slot frees, measured slower than copying (N=4, 4 MiB: 3.6 ms against
// 1.4 ms); rings (allgather) gained.
bool copiedOutByPeer(CollectiveKind kind, int nranks, const Step& st) {
  switch (kind) {
    case CollectiveKind::kBroadcast:
      return nranks == 2;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kPointToPoint:
      return true;
    case CollectiveKind::kAllReduce:
      return st.recvPeer >= 0 && st.action == RecvAction::kCopy;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kReduce:
      return false;
  }
  return false;
}

// Memory a chunk op touches, for dependency analysis.
struct Access {
  int step;
  uint16_t link;
  bool isSend;
  uint32_t index;
  Interval reads[2];
  Interval writes;
};

class PlanBuilder {
 public:
  explicit PlanBuilder(const PlanInput& in) : in_(in) {}

  Plan build() {
    const Schedule& s = *in_.schedule;
    steps_.resize(s.steps.size());
    for (size_t k = 0; k < s.steps.size(); ++k) {
      const Step& st = s.steps[k];
      if (st.sendPeer >= 0)
        addSends(static_cast<int>(k), st);
      if (st.recvPeer >= 0)
        addRecvs(static_cast<int>(k), st);
    }
    emitGroupMajor();
    resolveForwards();
    computeDependencies();
    return std::move(plan_);
  }

 private:
  // Chunks of one step before they are placed in the link queues.
  struct StepChunks {
    uint16_t sendLink = 0, recvLink = 0;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    std::vector<size_t> sendAccess, recvAccess;  // index into accesses_
    std::vector<uint32_t> sendIndex, recvIndex;  // position in the link queue once emitted
    int forwardsStep = -1;                       // sends forward this step's receives
  };

  uint16_t linkIndex(int peer) {
    for (size_t i = 0; i < plan_.links.size(); ++i) {
      if (plan_.links[i].peer == peer)
        return static_cast<uint16_t>(i);
    }
    plan_.links.push_back({peer, {}, {}});
    return static_cast<uint16_t>(plan_.links.size() - 1);
  }

  const uint8_t* address(const BufferRange& r) const {
    const uint8_t* base = r.buffer == BufferId::kSend ? in_.send : in_.recv;
    return base + r.offset * in_.elementSize;
  }
  const transport::MemoryRegion* region(const BufferRange& r) const {
    return r.buffer == BufferId::kSend ? in_.sendRegion : in_.recvRegion;
  }
  Interval interval(const uint8_t* p, uint64_t count) const {
    auto b = reinterpret_cast<uintptr_t>(p);
    return {b, b + count * in_.elementSize};
  }

  void addSends(int step, const Step& st) {
    StepChunks& sc = steps_[step];
    sc.sendLink = linkIndex(st.sendPeer);
    if (st.forwards()) {
      const int from = st.forwardedStep(step);
      GS_CHECK(from >= 0 && from < step && in_.schedule->steps[from].recvPeer >= 0, Errc::kInternal,
               "step %d forwards without a receive in step %d", step, from);
      sc.forwardsStep = from;
      for (const RecvOp& r : steps_[from].recvs) {
        SendOp op{static_cast<uint16_t>(step), r.chunkIndex, r.elementOffset, r.count};
        op.forwardLink = steps_[from].recvLink;
        sc.sends.push_back(op);
        sc.sendAccess.push_back(accesses_.size());
        accesses_.push_back({step, sc.sendLink, true, 0, {}, {}});
      }
      return;
    }
    if (st.send.count == 0 && st.announceEmpty) {
      // One header-only chunk: no source, nothing read.
      SendOp op{static_cast<uint16_t>(step), 0, 0, 0};
      op.raw = true;
      sc.sends.push_back(op);
      sc.sendAccess.push_back(accesses_.size());
      accesses_.push_back({step, sc.sendLink, true, 0, {}, {}});
      return;
    }
    const uint8_t* base = address(st.send);
    for (uint64_t off = 0, c = 0; off < st.send.count; off += in_.chunkElements, ++c) {
      const auto n =
          static_cast<uint32_t>(std::min<uint64_t>(in_.chunkElements, st.send.count - off));
      SendOp op{static_cast<uint16_t>(step), static_cast<uint32_t>(c), off, n};
      op.raw = st.raw;
      op.stepCount = st.send.count;
      op.source = base + off * in_.elementSize;
      op.region = region(st.send);
      op.regionOffset =
          static_cast<size_t>(op.source - static_cast<const uint8_t*>(op.region->data()));
      if (st.hasReplica)
        op.replica = const_cast<uint8_t*>(address(st.replica)) + off * in_.elementSize;
      op.peerCopies = copiedOutByPeer(in_.schedule->kind, in_.schedule->nranks, st);
      sc.sends.push_back(op);
      sc.sendAccess.push_back(accesses_.size());
      accesses_.push_back({step, sc.sendLink, true, 0, {interval(op.source, n), {}}, {}});
    }
  }

  void addRecvs(int step, const Step& st) {
    StepChunks& sc = steps_[step];
    sc.recvLink = linkIndex(st.recvPeer);
    if (st.recvCount == 0 && st.announceEmpty) {
      // The peer's header-only chunk: validated, nothing written.
      sc.recvs.push_back(RecvOp{static_cast<uint16_t>(step), 0, 0, 0, RecvAction::kCopy, false});
      sc.recvAccess.push_back(accesses_.size());
      accesses_.push_back({step, sc.recvLink, false, 0, {}, {}});
      return;
    }
    for (uint64_t off = 0, c = 0; off < st.recvCount; off += in_.chunkElements, ++c) {
      const auto n =
          static_cast<uint32_t>(std::min<uint64_t>(in_.chunkElements, st.recvCount - off));
      RecvOp op{
          static_cast<uint16_t>(step), static_cast<uint32_t>(c), off, n, st.action, st.finalize};
      op.stepCount = st.recvCount;
      op.incomingFirst = st.incomingFirst;
      op.raw = st.raw;
      Access a{step, sc.recvLink, false, 0, {}, {}};
      if (st.action != RecvAction::kReduceToSlot) {
        op.dst = const_cast<uint8_t*>(address(st.dst)) + off * in_.elementSize;
        a.writes = interval(op.dst, n);
        if (st.action == RecvAction::kReduce)
          a.reads[0] = a.writes;
      }
      if (st.action == RecvAction::kReduceWith || st.action == RecvAction::kReduceToSlot) {
        op.operand = address(st.operand) + off * in_.elementSize;
        a.reads[1] = interval(op.operand, n);
      }
      sc.recvs.push_back(op);
      sc.recvAccess.push_back(accesses_.size());
      accesses_.push_back(a);
    }
  }

  // Places chunks into the link queues phase by phase, and inside a phase group by group, each
  // group step by step. A phase is a maximal run of consecutive steps that are all grouped or
  // all whole (Step::whole). Sender and receiver of a link derive the same order: the marks
  // and the phases come from the schedule's shape, which both ends share; whether a step
  // forwards or is forwarded does not (a tree leaf sends from its buffer what its parent
  // forwards).
  //
  // Grouped steps interleave (a receiver holding a group for forwarding keeps room for the
  // next). Whole steps (halving-doubling's, also hierarchical's across hosts) go one after the
  // other: such a step may reuse a link in a later step over other element ranges, and
  // interleaving their groups would queue a chunk that waits on the peer's later chunks of an
  // earlier step ahead of our own, a cycle. Phases never interleave: hierarchical's allgather
  // inside a host waits for the whole exchange across hosts, which waits for every chunk of
  // the reduce-scatter before it.
  void emitGroupMajor() {
    const Schedule& schedule = *in_.schedule;
    for (StepChunks& sc : steps_) {
      sc.sendIndex.resize(sc.sends.size());
      sc.recvIndex.resize(sc.recvs.size());
    }
    for (size_t first = 0; first < steps_.size();) {
      const bool whole = schedule.steps[first].whole;
      size_t last = first;
      size_t maxChunks = 0;
      while (last < steps_.size() && schedule.steps[last].whole == whole) {
        maxChunks = std::max({maxChunks, steps_[last].sends.size(), steps_[last].recvs.size()});
        ++last;
      }
      const size_t g = whole ? SIZE_MAX : std::max<size_t>(1, in_.groupChunks);
      if (whole) {
        for (size_t si = first; si < last; ++si)
          emitChunks(steps_[si], 0, SIZE_MAX);
      } else {
        for (size_t begin = 0; begin < maxChunks; begin += g) {
          for (size_t si = first; si < last; ++si)
            emitChunks(steps_[si], begin, begin + g);
        }
      }
      first = last;
    }
  }

  // Appends chunks [begin, end) of one step to its links' queues.
  void emitChunks(StepChunks& sc, size_t begin, size_t end) {
    for (size_t c = begin; c < std::min(end, sc.sends.size()); ++c) {
      auto& q = plan_.links[sc.sendLink].sends;
      sc.sendIndex[c] = static_cast<uint32_t>(q.size());
      accesses_[sc.sendAccess[c]].index = sc.sendIndex[c];
      q.push_back(sc.sends[c]);
    }
    for (size_t c = begin; c < std::min(end, sc.recvs.size()); ++c) {
      auto& q = plan_.links[sc.recvLink].recvs;
      sc.recvIndex[c] = static_cast<uint32_t>(q.size());
      accesses_[sc.recvAccess[c]].index = sc.recvIndex[c];
      q.push_back(sc.recvs[c]);
    }
  }

  void resolveForwards() {
    for (StepChunks& sc : steps_) {
      if (sc.forwardsStep < 0)
        continue;
      StepChunks& from = steps_[sc.forwardsStep];
      for (size_t c = 0; c < sc.sends.size(); ++c) {
        SendOp& op = plan_.links[sc.sendLink].sends[sc.sendIndex[c]];
        op.forwardIndex = from.recvIndex[c];
        RecvOp& forwarded = plan_.links[from.recvLink].recvs[op.forwardIndex];
        if (forwarded.forwarded++ == 0)
          forwarded.forwardedOn = static_cast<int32_t>(sc.sendLink);
      }
    }
  }

  static bool conflicts(const Access& a, const Access& b) {
    auto hit = [](const Interval& x, const Interval& y) {
      return !x.empty() && !y.empty() && x.overlaps(y);
    };
    if (hit(a.writes, b.writes))
      return true;
    for (const Interval& r : a.reads) {
      if (hit(r, b.writes))
        return true;
    }
    for (const Interval& r : b.reads) {
      if (hit(r, a.writes))
        return true;
    }
    return false;
  }

  // For each op, the latest op of an earlier step on each (link, direction) whose memory
  // conflicts with it; waiting for that one covers the earlier ones of the same queue, which
  // complete in order. Forwarding sends wait for the receive they forward.
  void computeDependencies() {
    const size_t nl = plan_.links.size();
    // Span of all memory each step touches and where its accesses start, so that steps that
    // cannot conflict are skipped whole.
    std::vector<Interval> span(in_.schedule->steps.size(), Interval{UINTPTR_MAX, 0});
    std::vector<size_t> firstAccess(in_.schedule->steps.size() + 1, accesses_.size());
    for (size_t i = accesses_.size(); i-- > 0;) {
      const Access& a = accesses_[i];
      Interval& sp = span[a.step];
      firstAccess[a.step] = i;
      for (const Interval* iv : {&a.reads[0], &a.reads[1], &a.writes}) {
        if (iv->empty())
          continue;
        sp.begin = std::min(sp.begin, iv->begin);
        sp.end = std::max(sp.end, iv->end);
      }
    }
    std::vector<int64_t> latest(2 * nl);
    for (size_t i = 0; i < accesses_.size(); ++i) {
      const Access& a = accesses_[i];
      std::fill(latest.begin(), latest.end(), -1);
      for (size_t j = i; j-- > 0;) {
        const Access& b = accesses_[j];
        if (b.step >= a.step)
          continue;
        if (!span[b.step].overlaps(span[a.step])) {
          j = firstAccess[b.step];  // skip the rest of step b
          continue;
        }
        const size_t slot = 2 * b.link + (b.isSend ? 1 : 0);
        if (latest[slot] >= static_cast<int64_t>(b.index))
          continue;
        if (conflicts(a, b))
          latest[slot] = b.index;
      }
      auto& l = plan_.links[a.link];
      uint32_t* begin = a.isSend ? &l.sends[a.index].depBegin : &l.recvs[a.index].depBegin;
      uint32_t* end = a.isSend ? &l.sends[a.index].depEnd : &l.recvs[a.index].depEnd;
      *begin = static_cast<uint32_t>(plan_.deps.size());
      for (size_t s = 0; s < latest.size(); ++s) {
        if (latest[s] >= 0) {
          plan_.deps.push_back(
              {static_cast<uint16_t>(s / 2), (s % 2) == 1, static_cast<uint32_t>(latest[s] + 1)});
        }
      }
      if (a.isSend && l.sends[a.index].forwardLink >= 0) {
        const SendOp& op = l.sends[a.index];
        plan_.deps.push_back({static_cast<uint16_t>(op.forwardLink), false, op.forwardIndex + 1});
      }
      *end = static_cast<uint32_t>(plan_.deps.size());
    }
  }

  const PlanInput& in_;
  Plan plan_;
  std::vector<StepChunks> steps_;
  std::vector<Access> accesses_;
};

}  // namespace

Plan buildPlan(const PlanInput& input) {
  Plan plan = PlanBuilder(input).build();
  plan.messages.push_back({DataType::kFloat32, static_cast<uint32_t>(input.elementSize), 0});
  return plan;
}

void appendMessage(Plan& plan, Plan::LinkQueues& q, const MessageInput& m) {
  const auto index = static_cast<uint32_t>(plan.messages.size());
  const size_t esize = elementSize(m.dtype);
  plan.messages.push_back({m.dtype, static_cast<uint32_t>(esize), m.id});
  // The step field is diagnostics only (timeout messages): the message's number.
  const auto step = static_cast<uint16_t>(m.id);
  const size_t chunks = m.count == 0 ? 1 : (m.count + m.chunkElements - 1) / m.chunkElements;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t offset = c * m.chunkElements;
    const auto count = static_cast<uint32_t>(std::min(m.chunkElements, m.count - offset));
    if (m.send) {
      SendOp op{};
      op.step = step;
      op.chunkIndex = static_cast<uint32_t>(c);
      op.elementOffset = offset;
      op.count = count;
      op.source = m.buffer + offset * esize;
      op.region = m.region;
      op.regionOffset = offset * esize;
      op.raw = m.raw;
      op.stepCount = m.count;
      op.message = index;
      op.peerCopies = true;  // a receive is a copy into the receiver's buffer
      q.sends.push_back(op);
    } else {
      RecvOp op{};
      op.step = step;
      op.chunkIndex = static_cast<uint32_t>(c);
      op.elementOffset = offset;
      op.count = count;
      op.action = RecvAction::kCopy;
      op.finalize = false;
      op.dst = m.buffer + offset * esize;
      op.raw = m.raw;
      op.stepCount = m.count;
      op.message = index;
      q.recvs.push_back(op);
    }
  }
}

}  // namespace gs::stream
