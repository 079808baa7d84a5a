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
    for (size_t k = 0; k < s.steps.size(); ++k) {
      const Step& st = s.steps[k];
      if (st.sendPeer >= 0) addSends(static_cast<int>(k), st);
      if (st.recvPeer >= 0) addRecvs(static_cast<int>(k), st);
    }
    markForwarded();
    computeDependencies();
    return std::move(plan_);
  }

 private:
  uint16_t linkIndex(int peer) {
    for (size_t i = 0; i < plan_.links.size(); ++i) {
      if (plan_.links[i].peer == peer) return static_cast<uint16_t>(i);
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
    const uint16_t li = linkIndex(st.sendPeer);
    auto& q = plan_.links[li].sends;
    if (st.sendForwardsPrevious) {
      GS_CHECK(step > 0 && lastRecvLink_ >= 0, Errc::kInternal, "forward without a receive");
      auto& src = plan_.links[lastRecvLink_].recvs;
      for (uint32_t i = lastRecvBegin_; i < src.size(); ++i) {
        SendOp op{static_cast<uint16_t>(step), src[i].chunkIndex, src[i].elementOffset,
                  src[i].count};
        op.forwardLink = lastRecvLink_;
        op.forwardIndex = i;
        q.push_back(op);
        accesses_.push_back({step, li, true, static_cast<uint32_t>(q.size() - 1), {}, {}});
      }
      return;
    }
    const uint8_t* base = address(st.send);
    for (uint64_t off = 0, c = 0; off < st.send.count; off += in_.chunkElements, ++c) {
      const auto n = static_cast<uint32_t>(std::min<uint64_t>(in_.chunkElements, st.send.count - off));
      SendOp op{static_cast<uint16_t>(step), static_cast<uint32_t>(c), off, n};
      op.source = base + off * in_.elementSize;
      op.region = region(st.send);
      op.regionOffset = static_cast<size_t>(op.source - static_cast<const uint8_t*>(op.region->data()));
      q.push_back(op);
      Access a{step, li, true, static_cast<uint32_t>(q.size() - 1), {interval(op.source, n), {}}, {}};
      accesses_.push_back(a);
    }
  }

  void addRecvs(int step, const Step& st) {
    const uint16_t li = linkIndex(st.recvPeer);
    auto& q = plan_.links[li].recvs;
    lastRecvLink_ = li;
    lastRecvBegin_ = static_cast<uint32_t>(q.size());
    for (uint64_t off = 0, c = 0; off < st.recvCount; off += in_.chunkElements, ++c) {
      const auto n = static_cast<uint32_t>(std::min<uint64_t>(in_.chunkElements, st.recvCount - off));
      RecvOp op{static_cast<uint16_t>(step), static_cast<uint32_t>(c), off, n, st.action, st.finalize};
      Access a{step, li, false, static_cast<uint32_t>(q.size()), {}, {}};
      if (st.action != RecvAction::kReduceToSlot) {
        op.dst = const_cast<uint8_t*>(address(st.dst)) + off * in_.elementSize;
        a.writes = interval(op.dst, n);
        if (st.action == RecvAction::kReduce) a.reads[0] = a.writes;
      }
      if (st.action == RecvAction::kReduceWith || st.action == RecvAction::kReduceToSlot) {
        op.operand = address(st.operand) + off * in_.elementSize;
        a.reads[1] = interval(op.operand, n);
      }
      q.push_back(op);
      accesses_.push_back(a);
    }
  }

  void markForwarded() {
    for (auto& l : plan_.links) {
      for (const SendOp& s : l.sends) {
        if (s.forwardLink >= 0) plan_.links[s.forwardLink].recvs[s.forwardIndex].forwarded = true;
      }
    }
  }

  static bool conflicts(const Access& a, const Access& b) {
    auto hit = [](const Interval& x, const Interval& y) {
      return !x.empty() && !y.empty() && x.overlaps(y);
    };
    if (hit(a.writes, b.writes)) return true;
    for (const Interval& r : a.reads) {
      if (hit(r, b.writes)) return true;
    }
    for (const Interval& r : b.reads) {
      if (hit(r, a.writes)) return true;
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
        if (iv->empty()) continue;
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
        if (b.step >= a.step) continue;
        if (!span[b.step].overlaps(span[a.step])) {
          j = firstAccess[b.step];  // skip the rest of step b
          continue;
        }
        const size_t slot = 2 * b.link + (b.isSend ? 1 : 0);
        if (latest[slot] >= static_cast<int64_t>(b.index)) continue;
        if (conflicts(a, b)) latest[slot] = b.index;
      }
      auto& l = plan_.links[a.link];
      uint32_t* begin = a.isSend ? &l.sends[a.index].depBegin : &l.recvs[a.index].depBegin;
      uint32_t* end = a.isSend ? &l.sends[a.index].depEnd : &l.recvs[a.index].depEnd;
      *begin = static_cast<uint32_t>(plan_.deps.size());
      for (size_t s = 0; s < latest.size(); ++s) {
        if (latest[s] >= 0) {
          plan_.deps.push_back({static_cast<uint16_t>(s / 2), (s % 2) == 1,
                                static_cast<uint32_t>(latest[s] + 1)});
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
  std::vector<Access> accesses_;
  int lastRecvLink_ = -1;
  uint32_t lastRecvBegin_ = 0;
};

}  // namespace

Plan buildPlan(const PlanInput& input) { return PlanBuilder(input).build(); }

}  // namespace gs::stream
