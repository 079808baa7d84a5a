// buildPlan: link queues of neighbouring ranks agree chunk for chunk; forwards and
// dependencies are consistent; every memory hazard between steps (including the in-place
// write-after-read ones) is covered by a dependency. The hazard check is computed here from
// the plan's own pointers, independently of plan.cc's interval analysis.
#include "stream/plan.h"

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "schedules/schedule.h"
#include "schedules/topology.h"
#include "transport/memory.h"

namespace gs::stream {
namespace {

class FakeRegion : public transport::MemoryRegion {
 public:
  using MemoryRegion::MemoryRegion;
  transport::RemoteKey remoteKey() const override { return {}; }
};

// One rank's plan with its buffers (kept alive with it).
struct RankPlan {
  Schedule schedule;
  std::vector<uint8_t> sendBuf, recvBuf;
  std::unique_ptr<FakeRegion> sendRegion, recvRegion;
  Plan plan;
  size_t elementSize = 0, chunkElements = 0, groupChunks = 0;
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;

  const Plan::LinkQueues* link(int peer) const {
    for (const auto& l : plan.links) {
      if (l.peer == peer)
        return &l;
    }
    return nullptr;
  }
};

std::unique_ptr<RankPlan> makePlanOf(
    Schedule schedule, size_t es, size_t chunkElements, size_t groupChunks, bool inPlace) {
  auto rp = std::make_unique<RankPlan>();
  rp->schedule = std::move(schedule);
  rp->elementSize = es;
  rp->chunkElements = chunkElements;
  rp->groupChunks = groupChunks;
  rp->recvBuf.resize(std::max<size_t>(1, rp->schedule.recvCount * es));
  rp->recv = rp->recvBuf.data();
  rp->recvRegion = std::make_unique<FakeRegion>(rp->recvBuf.data(), rp->recvBuf.size());
  if (inPlace) {
    rp->send = rp->recv;
  } else {
    rp->sendBuf.resize(std::max<size_t>(1, rp->schedule.sendCount * es));
    rp->send = rp->sendBuf.data();
    rp->sendRegion = std::make_unique<FakeRegion>(rp->sendBuf.data(), rp->sendBuf.size());
  }
  const transport::MemoryRegion* sr = inPlace ? rp->recvRegion.get() : rp->sendRegion.get();
  rp->plan = buildPlan({&rp->schedule, rp->send, rp->recv, sr, rp->recvRegion.get(), es,
                        chunkElements, groupChunks});
  return rp;
}

std::unique_ptr<RankPlan> makePlan(CollectiveKind kind,
                                   int rank,
                                   int n,
                                   int root,
                                   size_t count,
                                   size_t es,
                                   size_t chunkElements,
                                   size_t groupChunks,
                                   bool inPlace,
                                   bool twoRankExchange = false) {
  return makePlanOf(buildSchedule(kind, rank, n, root, count, twoRankExchange), es, chunkElements,
                    groupChunks, inPlace);
}

// ----- memory hazards, computed from the plan's pointers ------------------------------------
struct Span {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const Span& o) const {
    return begin < end && o.begin < o.end && begin < o.end && o.begin < end;
  }
};
struct OpRef {
  uint16_t link;
  bool isSend;
  uint32_t index;
  int step;
  std::vector<Span> reads, writes;
  uint32_t depBegin, depEnd;
};

std::vector<OpRef> opsOf(const RankPlan& rp) {
  std::vector<OpRef> ops;
  const size_t es = rp.elementSize;
  auto span = [&](const uint8_t* p, size_t count) {
    auto b = reinterpret_cast<uintptr_t>(p);
    return Span{b, b + count * es};
  };
  for (size_t li = 0; li < rp.plan.links.size(); ++li) {
    const auto& l = rp.plan.links[li];
    for (uint32_t i = 0; i < l.sends.size(); ++i) {
      const SendOp& s = l.sends[i];
      OpRef o{static_cast<uint16_t>(li), true, i, s.step, {}, {}, s.depBegin, s.depEnd};
      if (s.source)
        o.reads.push_back(span(s.source, s.count));
      ops.push_back(o);
    }
    for (uint32_t i = 0; i < l.recvs.size(); ++i) {
      const RecvOp& r = l.recvs[i];
      OpRef o{static_cast<uint16_t>(li), false, i, r.step, {}, {}, r.depBegin, r.depEnd};
      if (r.dst)
        o.writes.push_back(span(r.dst, r.count));
      if (r.dst && r.action == RecvAction::kReduce)
        o.reads.push_back(span(r.dst, r.count));
      if (r.operand)
        o.reads.push_back(span(r.operand, r.count));
      ops.push_back(o);
    }
  }
  return ops;
}

bool conflict(const OpRef& a, const OpRef& b) {
  for (const Span& w : a.writes) {
    for (const Span& x : b.writes)
      if (w.overlaps(x))
        return true;
    for (const Span& x : b.reads)
      if (w.overlaps(x))
        return true;
  }
  for (const Span& r : a.reads) {
    for (const Span& x : b.writes)
      if (r.overlaps(x))
        return true;
  }
  return false;
}

// Returns "" when every later-step op waits (directly, on the same queue at or past it) for
// every earlier-step op it conflicts with; else the first violation.
std::string checkHazards(const RankPlan& rp) {
  const auto ops = opsOf(rp);
  for (const OpRef& a : ops) {
    for (const OpRef& b : ops) {
      if (b.step >= a.step || !conflict(a, b))
        continue;
      bool covered = false;
      for (uint32_t d = a.depBegin; d < a.depEnd; ++d) {
        const Dependency& dep = rp.plan.deps[d];
        covered |= dep.link == b.link && dep.onSend == b.isSend && dep.count >= b.index + 1;
      }
      if (!covered) {
        return std::string(a.isSend ? "send" : "recv") + " #" + std::to_string(a.index) +
               " (step " + std::to_string(a.step) + ") does not wait for " +
               (b.isSend ? "send" : "recv") + " #" + std::to_string(b.index) + " (step " +
               std::to_string(b.step) + ")";
      }
    }
  }
  return "";
}

// Structural checks of one plan.
std::string checkStructure(const RankPlan& rp) {
  const Plan& p = rp.plan;
  const Schedule& s = rp.schedule;
  const size_t g = std::max<size_t>(1, rp.groupChunks);
  for (size_t li = 0; li < p.links.size(); ++li) {
    const auto& l = p.links[li];
    std::vector<int> forwardedBy(l.recvs.size(), 0);
    (void)forwardedBy;
    // Dependencies point at existing ops of strictly earlier steps.
    auto checkDeps = [&](uint32_t begin, uint32_t end, int step, const char* what,
                         size_t i) -> std::string {
      if (begin > end || end > p.deps.size())
        return std::string(what) + " dep range";
      for (uint32_t d = begin; d < end; ++d) {
        const Dependency& dep = p.deps[d];
        if (dep.link >= p.links.size() || dep.count == 0)
          return "bad dependency";
        const auto& tl = p.links[dep.link];
        const size_t qlen = dep.onSend ? tl.sends.size() : tl.recvs.size();
        if (dep.count > qlen)
          return "dependency past the end of a queue";
        const int tstep = dep.onSend ? tl.sends[dep.count - 1].step : tl.recvs[dep.count - 1].step;
        if (tstep >= step)
          return std::string(what) + " #" + std::to_string(i) +
                 " waits for a step that is not earlier";
      }
      return "";
    };
    for (size_t i = 0; i < l.sends.size(); ++i) {
      const SendOp& op = l.sends[i];
      if (auto e = checkDeps(op.depBegin, op.depEnd, op.step, "send", i); !e.empty())
        return e;
      if (op.count == 0 || op.count > rp.chunkElements)
        return "send chunk size";
      const Step& st = s.steps.at(op.step);
      if (st.sendPeer != l.peer)
        return "send on the wrong link";
      if (st.forwards()) {
        if (op.forwardLink < 0 || op.source != nullptr)
          return "forward without forwardLink";
        const auto& fl = p.links.at(static_cast<size_t>(op.forwardLink));
        if (op.forwardIndex >= fl.recvs.size())
          return "forwardIndex out of range";
        const RecvOp& r = fl.recvs[op.forwardIndex];
        if (!r.forwarded)
          return "forwarded receive not marked";
        if (r.step != st.forwardedStep(op.step) || r.chunkIndex != op.chunkIndex ||
            r.count != op.count || r.elementOffset != op.elementOffset) {
          return "forward does not match the receive it forwards";
        }
        bool waits = false;
        for (uint32_t d = op.depBegin; d < op.depEnd; ++d) {
          const Dependency& dep = p.deps[d];
          waits |= dep.link == op.forwardLink && !dep.onSend && dep.count >= op.forwardIndex + 1;
        }
        if (!waits)
          return "forward does not wait for its receive";
      } else {
        if (op.forwardLink >= 0 || op.source == nullptr)
          return "buffer send without source";
        const uint8_t* base = st.send.buffer == BufferId::kSend ? rp.send : rp.recv;
        if (op.source != base + (st.send.offset + op.elementOffset) * rp.elementSize)
          return "send source address";
        if (op.region == nullptr ||
            op.source != static_cast<const uint8_t*>(op.region->data()) + op.regionOffset ||
            op.regionOffset + op.count * rp.elementSize > op.region->size()) {
          return "send region/offset";
        }
      }
    }
    for (size_t i = 0; i < l.recvs.size(); ++i) {
      const RecvOp& op = l.recvs[i];
      if (auto e = checkDeps(op.depBegin, op.depEnd, op.step + 1, "recv", i);
          !e.empty() && op.step > 0)
        return e;
      const Step& st = s.steps.at(op.step);
      if (st.recvPeer != l.peer)
        return "recv on the wrong link";
      if (op.action != st.action || op.finalize != st.finalize ||
          op.incomingFirst != st.incomingFirst) {
        return "recv action";
      }
      if (op.count == 0 || op.count > rp.chunkElements)
        return "recv chunk size";
      if (op.action != RecvAction::kReduceToSlot &&
          op.dst != rp.recv + (st.dst.offset + op.elementOffset) * rp.elementSize &&
          !(st.dst.buffer == BufferId::kSend)) {
        return "recv destination address";
      }
    }
    // Group-major order by phase: (phase, chunkIndex / g, step, chunkIndex) never decreases
    // along a queue, where a phase is a run of consecutive steps with the same Step::whole and
    // whole steps count as group 0.
    std::vector<int> phase(s.steps.size(), 0);
    for (size_t k = 1; k < s.steps.size(); ++k)
      phase[k] = phase[k - 1] + (s.steps[k].whole != s.steps[k - 1].whole ? 1 : 0);
    auto key = [&](uint16_t step, uint32_t chunk) {
      return std::make_tuple(phase.at(step), s.steps.at(step).whole ? 0 : chunk / g, step, chunk);
    };
    for (size_t i = 1; i < l.sends.size(); ++i) {
      if (key(l.sends[i].step, l.sends[i].chunkIndex) <=
          key(l.sends[i - 1].step, l.sends[i - 1].chunkIndex))
        return "send queue not group-major";
    }
    for (size_t i = 1; i < l.recvs.size(); ++i) {
      if (key(l.recvs[i].step, l.recvs[i].chunkIndex) <=
          key(l.recvs[i - 1].step, l.recvs[i - 1].chunkIndex))
        return "recv queue not group-major";
    }
  }
  // Per step: receive chunks tile [0, recvCount) in order; sends tile the send range.
  for (size_t k = 0; k < s.steps.size(); ++k) {
    const Step& st = s.steps[k];
    if (st.recvPeer >= 0) {
      const auto* l = rp.link(st.recvPeer);
      if (!l)
        return "missing receive link";
      uint64_t next = 0;
      uint32_t chunk = 0;
      for (const RecvOp& op : l->recvs) {
        if (op.step != k)
          continue;
        if (op.elementOffset != next || op.chunkIndex != chunk++)
          return "receive chunks do not tile the step";
        next += op.count;
      }
      if (next != st.recvCount)
        return "receive chunks do not cover the step";
    }
  }
  return "";
}

// Rank r's sends to r+1 and rank r+1's receives from r are the same chunks in the same order.
// Step numbers are compared for the ring collectives, where sender and receiver number them
// alike; the chain broadcast forwards in step 1 what the next rank receives in step 0 (the
// header's step is diagnostic only); so does the 2-rank exchange (send in step 0, receive in 1).
void expectQueuesMatch(const std::vector<std::unique_ptr<RankPlan>>& plans,
                       const std::string& what,
                       bool sameSteps) {
  const int n = static_cast<int>(plans.size());
  for (int r = 0; r < n; ++r) {
    for (int peer = 0; peer < n; ++peer) {
      if (peer == r)
        continue;
      const auto* out = plans[r]->link(peer);
      const auto* in = plans[peer]->link(r);
      const size_t sends = out ? out->sends.size() : 0;
      const size_t recvs = in ? in->recvs.size() : 0;
      ASSERT_EQ(sends, recvs) << what << ": " << r << " -> " << peer;
      for (size_t i = 0; i < sends; ++i) {
        const SendOp& s = out->sends[i];
        const RecvOp& q = in->recvs[i];
        ASSERT_EQ(std::make_tuple(sameSteps ? s.step : 0, s.chunkIndex, s.count, s.elementOffset),
                  std::make_tuple(sameSteps ? q.step : 0, q.chunkIndex, q.count, q.elementOffset))
            << what << ": " << r << " -> " << peer << " chunk #" << i;
      }
    }
  }
}

// Runs the plans of all ranks against each other the way the engine does, with a transport
// that delivers at once: per link, sends go in queue order once their dependencies hold and the
// receiver has a free slot (`slots` per link, released in order, a forwarded chunk's only once
// every forward of it left); receives go in queue order once their chunk arrived and their
// dependencies hold. Returns "" when every queue drains, else where the ranks stall (a
// deadlock the real engine would only end with its timeout).
std::string simulateStalls(const std::vector<std::unique_ptr<RankPlan>>& plans, size_t slots) {
  struct LinkState {
    size_t posted = 0, processed = 0, released = 0;
    std::vector<uint16_t> forwardsDone;
  };
  const int n = static_cast<int>(plans.size());
  std::vector<std::vector<LinkState>> state(n);
  for (int r = 0; r < n; ++r) {
    for (const auto& l : plans[r]->plan.links) {
      state[r].emplace_back();
      state[r].back().forwardsDone.assign(l.recvs.size(), 0);
    }
  }
  auto linkTo = [&](int r, int peer) -> size_t {
    const auto& links = plans[r]->plan.links;
    for (size_t i = 0; i < links.size(); ++i) {
      if (links[i].peer == peer)
        return i;
    }
    return SIZE_MAX;
  };
  auto satisfied = [&](int r, uint32_t begin, uint32_t end) {
    for (uint32_t d = begin; d < end; ++d) {
      const Dependency& dep = plans[r]->plan.deps[d];
      const LinkState& ls = state[r][dep.link];
      if ((dep.onSend ? ls.posted : ls.processed) < dep.count)
        return false;
    }
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      const Plan& plan = plans[r]->plan;
      for (size_t li = 0; li < plan.links.size(); ++li) {
        const auto& l = plan.links[li];
        LinkState& ls = state[r][li];
        const size_t back = linkTo(l.peer, r);
        if (back == SIZE_MAX)
          return "rank " + std::to_string(l.peer) + " has no link to rank " + std::to_string(r);
        while (ls.posted < l.sends.size()) {
          const SendOp& op = l.sends[ls.posted];
          if (!satisfied(r, op.depBegin, op.depEnd) ||
              ls.posted - state[l.peer][back].released >= slots)
            break;
          if (op.forwardLink >= 0)
            ++state[r][static_cast<size_t>(op.forwardLink)].forwardsDone[op.forwardIndex];
          ++ls.posted;
          progress = true;
        }
        while (ls.processed < l.recvs.size() && state[l.peer][back].posted > ls.processed &&
               satisfied(r, l.recvs[ls.processed].depBegin, l.recvs[ls.processed].depEnd)) {
          ++ls.processed;
          progress = true;
        }
        while (ls.released < ls.processed &&
               ls.forwardsDone[ls.released] >= l.recvs[ls.released].forwarded) {
          ++ls.released;
          progress = true;
        }
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const Plan& plan = plans[r]->plan;
    for (size_t li = 0; li < plan.links.size(); ++li) {
      const auto& l = plan.links[li];
      const LinkState& ls = state[r][li];
      if (ls.posted < l.sends.size()) {
        const SendOp& op = l.sends[ls.posted];
        return "rank " + std::to_string(r) + " stalls sending chunk " +
               std::to_string(op.chunkIndex) + " of step " + std::to_string(op.step) + " to rank " +
               std::to_string(l.peer) + " (" + std::to_string(ls.posted) + " of " +
               std::to_string(l.sends.size()) + " sent)";
      }
      if (ls.processed < l.recvs.size()) {
        const RecvOp& op = l.recvs[ls.processed];
        return "rank " + std::to_string(r) + " stalls receiving chunk " +
               std::to_string(op.chunkIndex) + " of step " + std::to_string(op.step) +
               " from rank " + std::to_string(l.peer);
      }
    }
  }
  return "";
}

constexpr CollectiveKind kKinds[] = {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                                     CollectiveKind::kAllGather, CollectiveKind::kBroadcast};

TEST(Plan, NeighbourQueuesMatchAndPlansAreConsistent) {
  int plansChecked = 0;
  for (CollectiveKind kind : kKinds) {
    for (int n = 2; n <= 5; ++n) {
      for (size_t count : {size_t{1}, size_t{5}, size_t{37}, size_t{100}}) {
        for (size_t chunk : {size_t{1}, size_t{3}, size_t{16}, size_t{1000}}) {
          for (size_t group : {size_t{1}, size_t{2}, size_t{4}}) {
            for (int variant = 0; variant < 4; ++variant) {
              const bool inPlace = variant & 1, twoRankExchange = variant & 2;
              if (inPlace && kind != CollectiveKind::kAllReduce &&
                  kind != CollectiveKind::kBroadcast)
                continue;
              if (twoRankExchange && (kind != CollectiveKind::kAllReduce || n != 2))
                continue;
              const int root = kind == CollectiveKind::kBroadcast ? static_cast<int>(count % n) : 0;
              std::vector<std::unique_ptr<RankPlan>> plans;
              for (int r = 0; r < n; ++r) {
                plans.push_back(
                    makePlan(kind, r, n, root, count, 4, chunk, group, inPlace, twoRankExchange));
              }
              const std::string what =
                  std::string(collectiveName(kind)) + " N=" + std::to_string(n) +
                  " count=" + std::to_string(count) + " chunk=" + std::to_string(chunk) +
                  " group=" + std::to_string(group) + (inPlace ? " in-place" : "") +
                  (twoRankExchange ? " exchange" : "");
              expectQueuesMatch(plans, what,
                                kind != CollectiveKind::kBroadcast && !twoRankExchange);
              ASSERT_EQ(simulateStalls(plans, 2 * group), "") << what;
              for (int r = 0; r < n; ++r) {
                ASSERT_EQ(checkStructure(*plans[r]), "") << what << " rank " << r;
                ASSERT_EQ(checkHazards(*plans[r]), "") << what << " rank " << r;
                ++plansChecked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(plansChecked, 1000);
}

// Tree, halving-doubling and hierarchical put several steps on one link, and one end of a link
// may forward what the other sends from its buffer: with more chunks than a group, both ends
// must still queue them in the same order (a tree allreduce of 16 MiB on 4 ranks failed with
// "chunk index differs" when they did not).
TEST(Plan, AllReduceAlgorithmsQueueLinksAlikeOnBothEndsAndNeverStall) {
  int plansChecked = 0;
  for (Algorithm algo : kAlgorithms) {
    for (int n = 2; n <= 9; ++n) {
      for (int perHost : {1, 2, 3}) {
        if (algo == Algorithm::kHierarchical && n % perHost != 0)
          continue;
        const Topology topology = Topology::blocks(n, perHost);
        for (size_t count : {size_t{7}, size_t{64}, size_t{257}}) {
          for (size_t chunk : {size_t{1}, size_t{4}, size_t{64}}) {
            // Recursive doubling sends the whole buffer every round: 257 one-element chunks
            // per round would double this test's time under TSan; 64 cover many chunks.
            if (algo == Algorithm::kRecursiveDoubling && chunk == 1 && count > 64)
              continue;
            for (size_t group : {size_t{1}, size_t{2}, size_t{4}}) {
              std::vector<std::unique_ptr<RankPlan>> plans;
              for (int r = 0; r < n; ++r) {
                plans.push_back(makePlanOf(buildAllReduce(algo, r, topology, count), 4, chunk,
                                           group, r % 2 == 0));
              }
              const std::string what =
                  std::string(algorithmName(algo)) + " N=" + std::to_string(n) + "/" +
                  std::to_string(perHost) + " count=" + std::to_string(count) +
                  " chunk=" + std::to_string(chunk) + " group=" + std::to_string(group);
              expectQueuesMatch(plans, what, false);
              // The engine's group is half the slots per link.
              ASSERT_EQ(simulateStalls(plans, 2 * group), "") << what;
              for (int r = 0; r < n; ++r) {
                ASSERT_EQ(checkStructure(*plans[r]), "") << what << " rank " << r;
                ++plansChecked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(plansChecked, 1000);
}

TEST(Plan, RingAllReduceShape) {
  // N=3, count 30 -> blocks of 10; chunks of 4 -> 3 chunks (4, 4, 2) per step; 4 steps.
  const int n = 3;
  for (int r = 0; r < n; ++r) {
    auto rp = makePlan(CollectiveKind::kAllReduce, r, n, 0, 30, 4, 4, 2, false);
    ASSERT_EQ(rp->plan.links.size(), 2u);
    const auto* right = rp->link((r + 1) % n);
    const auto* left = rp->link((r + n - 1) % n);
    ASSERT_NE(right, nullptr);
    ASSERT_NE(left, nullptr);
    EXPECT_EQ(right->sends.size(), 12u);
    EXPECT_TRUE(right->recvs.empty());
    EXPECT_EQ(left->recvs.size(), 12u);
    EXPECT_TRUE(left->sends.empty());
    // Group-major with 2 chunks per group: steps 0..3 chunks {0,1}, then steps 0..3 chunk {2}.
    std::vector<std::pair<int, int>> order;
    for (const SendOp& s : right->sends)
      order.emplace_back(s.step, s.chunkIndex);
    const std::vector<std::pair<int, int>> want = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1},
                                                   {3, 0}, {3, 1}, {0, 2}, {1, 2}, {2, 2}, {3, 2}};
    EXPECT_EQ(order, want);
    // Steps 1 and 3 forward what steps 0 and 2 received; steps 0 and 2 read buffers.
    for (const SendOp& s : right->sends) {
      EXPECT_EQ(s.forwardLink >= 0, s.step == 1 || s.step == 3) << "step " << s.step;
    }
    // Receives: reduce-to-slot (step 0), reduce-with + finalize (step 1), copies (2, 3).
    for (const RecvOp& q : left->recvs) {
      switch (q.step) {
        case 0:
          EXPECT_EQ(q.action, RecvAction::kReduceToSlot);
          EXPECT_TRUE(q.forwarded);
          break;
        case 1:
          EXPECT_EQ(q.action, RecvAction::kReduceWith);
          EXPECT_TRUE(q.finalize);
          EXPECT_FALSE(q.forwarded);
          break;
        case 2:
          EXPECT_EQ(q.action, RecvAction::kCopy);
          EXPECT_TRUE(q.forwarded);
          break;
        case 3:
          EXPECT_EQ(q.action, RecvAction::kCopy);
          EXPECT_FALSE(q.forwarded);
          break;
        default:
          ADD_FAILURE() << "step " << q.step;
      }
    }
  }
}

// In-place allreduce: the first allgather step (N-1) receives block r-1 into recv, the block
// that step 0 sent from the send buffer == recv. Each such receive must wait until the send of
// the same elements completed. Out of place, there is no such hazard, and no such dependency.
TEST(Plan, InPlaceAllReduceWaitsForStepZeroSends) {
  for (int n = 2; n <= 4; ++n) {
    for (size_t chunk : {size_t{1}, size_t{3}, size_t{8}}) {
      const size_t count = 29;
      for (int r = 0; r < n; ++r) {
        for (bool inPlace : {true, false}) {
          auto rp = makePlan(CollectiveKind::kAllReduce, r, n, 0, count, 8, chunk, 2, inPlace);
          const int right = (r + 1) % n, left = (r + n - 1) % n;
          const auto* out = rp->link(right);
          const auto* in = rp->link(left);
          ASSERT_TRUE(out && in);
          const uint16_t outIndex = static_cast<uint16_t>(out - rp->plan.links.data());
          const BufferRange block = ringSegment(BufferId::kRecv, count, n, (r - 1 + n) % n);
          int checked = 0;
          for (const RecvOp& q : in->recvs) {
            if (q.step != n - 1)
              continue;
            // This receive writes elements [block.offset + q.elementOffset, + q.count).
            ASSERT_EQ(q.dst, rp->recv + (block.offset + q.elementOffset) * 8);
            // The step-0 send chunks that read those elements, and the last of them in the queue.
            int64_t lastReader = -1;
            for (uint32_t i = 0; i < out->sends.size(); ++i) {
              const SendOp& s = out->sends[i];
              if (s.step != 0)
                continue;
              const uint64_t sb = block.offset + s.elementOffset, se = sb + s.count;
              const uint64_t qb = block.offset + q.elementOffset, qe = qb + q.count;
              if (sb < qe && qb < se)
                lastReader = i;
            }
            ASSERT_GE(lastReader, 0);
            bool waits = false;
            for (uint32_t d = q.depBegin; d < q.depEnd; ++d) {
              const Dependency& dep = rp->plan.deps[d];
              if (dep.link == outIndex && dep.onSend) {
                waits |= dep.count >= lastReader + 1;
              }
            }
            EXPECT_EQ(waits, inPlace) << "N=" << n << " rank " << r << " chunk " << chunk
                                      << " recv chunk " << q.chunkIndex;
            ++checked;
          }
          EXPECT_GT(checked, 0);
        }
      }
    }
  }
}

// In-place exchange: step 1's receive reduces into the buffer step 0 sends from; every receive
// chunk must wait for the send chunks reading the same elements.
TEST(Plan, InPlaceExchangeWaitsForItsSends) {
  for (int r = 0; r < 2; ++r) {
    for (size_t chunk : {size_t{1}, size_t{4}, size_t{100}}) {
      auto rp = makePlan(CollectiveKind::kAllReduce, r, 2, 0, 37, 4, chunk, 2, true, true);
      ASSERT_EQ(rp->plan.links.size(), 1u);
      const auto& l = rp->plan.links[0];
      ASSERT_EQ(l.sends.size(), l.recvs.size());
      for (const RecvOp& q : l.recvs) {
        EXPECT_EQ(q.incomingFirst, r == 1);
        uint32_t needed = 0;  // sends [0, needed) read elements this receive overwrites
        for (uint32_t i = 0; i < l.sends.size(); ++i) {
          const SendOp& s = l.sends[i];
          if (s.elementOffset < q.elementOffset + q.count &&
              q.elementOffset < s.elementOffset + s.count)
            needed = i + 1;
        }
        bool waits = false;
        for (uint32_t d = q.depBegin; d < q.depEnd; ++d) {
          waits |= rp->plan.deps[d].onSend && rp->plan.deps[d].count >= needed;
        }
        EXPECT_TRUE(waits) << "rank " << r << " chunk " << chunk << " recv " << q.chunkIndex;
      }
    }
  }
}

TEST(Plan, HazardCheckerDetectsDroppedDependencies) {
  // The positive hazard results above are meaningful only if dropping a needed dependency is
  // caught: remove each op's dependencies in turn from an in-place allreduce plan.
  auto rp = makePlan(CollectiveKind::kAllReduce, 1, 3, 0, 31, 4, 3, 2, true);
  ASSERT_EQ(checkHazards(*rp), "");
  int detected = 0, withDeps = 0;
  for (auto& l : rp->plan.links) {
    for (auto& q : l.recvs) {
      if (q.depBegin == q.depEnd)
        continue;
      ++withDeps;
      const uint32_t saved = q.depEnd;
      q.depEnd = q.depBegin;
      detected += checkHazards(*rp).empty() ? 0 : 1;
      q.depEnd = saved;
    }
  }
  EXPECT_GT(withDeps, 0);
  EXPECT_GT(detected, 0);
  EXPECT_EQ(checkHazards(*rp), "");
}

TEST(Plan, EmptyAndSingleRank) {
  auto one = makePlan(CollectiveKind::kAllReduce, 0, 1, 0, 10, 4, 4, 2, false);
  EXPECT_TRUE(one->plan.links.empty());
  auto zero = makePlan(CollectiveKind::kAllReduce, 0, 3, 0, 0, 4, 4, 2, false);
  for (const auto& l : zero->plan.links) {
    EXPECT_TRUE(l.sends.empty());
    EXPECT_TRUE(l.recvs.empty());
  }
}

}  // namespace
}  // namespace gs::stream
