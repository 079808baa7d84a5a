// The symbolic schedule checker (see checkSchedules in schedule.h). Values are sets of
// contributions, so "every rank holds every contribution exactly once" is checked exactly,
// independent of arithmetic.
#include <deque>
#include <functional>
#include <map>
#include <sstream>

#include "schedules/schedule.h"

namespace gs::stream {
namespace {

struct Sym {
  int64_t element = -1;  // index into the contributing ranks' send buffers; -1: never written
  std::vector<uint64_t> mask;
  int finalized = 0;
};

struct Failure {
  std::string what;
};

class Checker {
 public:
  using Factory = std::function<Schedule(int rank)>;
  Checker(CollectiveKind kind,
          int nranks,
          int root,
          size_t count,
          Factory factory,
          const std::vector<AllToAllLayout>* layouts = nullptr)
      : kind_(kind),
        n_(nranks),
        root_(root),
        count_(count),
        factory_(std::move(factory)),
        layouts_(layouts) {}

  std::string run() {
    try {
      setUp();
      simulate();
      verify();
    } catch (const Failure& f) {
      std::ostringstream os;
      os << collectiveName(kind_) << " N=" << n_ << " count=" << count_ << ": " << f.what;
      return os.str();
    }
    return "";
  }

 private:
  struct RankState {
    Schedule schedule;
    std::vector<Sym> send, recv;
    size_t step = 0;
    bool sent = false, received = false;
    std::vector<std::vector<Sym>> receivedAt;  // per step: what it received (for forwards)
  };

  std::vector<uint64_t> single(int r) const {
    std::vector<uint64_t> m((n_ + 63) / 64, 0);
    m[r / 64] |= uint64_t{1} << (r % 64);
    return m;
  }

  [[noreturn]] void fail(int rank, const std::string& what) const {
    throw Failure{"rank " + std::to_string(rank) + ": " + what};
  }

  std::vector<Sym>& buffer(RankState& s, BufferId b) {
    return b == BufferId::kSend ? s.send : s.recv;
  }

  std::vector<Sym> read(RankState& s, int r, const BufferRange& range) {
    auto& buf = buffer(s, range.buffer);
    if (range.offset + range.count > buf.size())
      fail(r, "range outside its buffer");
    return std::vector<Sym>(buf.begin() + static_cast<long>(range.offset),
                            buf.begin() + static_cast<long>(range.offset + range.count));
  }

  Sym combine(int r, const Sym& a, const Sym& b) const {
    if (a.element < 0 || b.element < 0)
      fail(r, "reduces an element never written");
    if (a.element != b.element)
      fail(r, "reduces different elements together");
    if (a.finalized || b.finalized)
      fail(r, "reduces an already finalized average");
    Sym out = a;
    for (size_t w = 0; w < a.mask.size(); ++w) {
      if (a.mask[w] & b.mask[w])
        fail(r, "counts a contribution twice");
      out.mask[w] |= b.mask[w];
    }
    return out;
  }

  void setUp() {
    ranks_.resize(n_);
    for (int r = 0; r < n_; ++r) {
      RankState& s = ranks_[r];
      s.schedule = factory_(r);
      s.receivedAt.resize(s.schedule.steps.size());
      s.send.resize(s.schedule.sendCount);
      for (size_t i = 0; i < s.send.size(); ++i)
        s.send[i] = Sym{static_cast<int64_t>(i), single(r), 0};
      s.recv.resize(s.schedule.recvCount);
      for (auto& [src, dst] : s.schedule.localCopies) {
        auto values = read(s, r, src);
        if (dst.count != src.count)
          fail(r, "local copy changes size");
        auto& out = buffer(s, dst.buffer);
        for (size_t i = 0; i < values.size(); ++i)
          out.at(dst.offset + i) = values[i];
      }
    }
  }

  bool advance(int r) {
    RankState& s = ranks_[r];
    if (s.step >= s.schedule.steps.size())
      return false;
    const Step& st = s.schedule.steps[s.step];
    bool progress = false;
    if (!s.sent) {
      if (st.sendPeer >= 0) {
        if (st.sendPeer == r || st.sendPeer >= n_)
          fail(r, "sends to an invalid peer");
        std::vector<Sym> payload;
        if (st.forwards()) {
          const int from = st.forwardedStep(static_cast<int>(s.step));
          if (from < 0 || from >= static_cast<int>(s.step) || s.schedule.steps[from].recvPeer < 0)
            fail(r, "forwards without an earlier receive");
          payload = s.receivedAt[from];
        } else {
          payload = read(s, r, st.send);
        }
        links_[{r, st.sendPeer}].push_back(std::move(payload));
      }
      s.sent = true;
      progress = true;
    }
    if (!s.received) {
      if (st.recvPeer < 0) {
        s.received = true;
      } else {
        auto& q = links_[{st.recvPeer, r}];
        if (!q.empty()) {
          std::vector<Sym> in = std::move(q.front());
          q.pop_front();
          if (in.size() != st.recvCount)
            fail(r, "receives a message of the wrong size");
          applyRecv(s, r, st, in);
          s.receivedAt[s.step] = std::move(in);
          s.received = true;
          progress = true;
        }
      }
    }
    if (s.sent && s.received) {
      ++s.step;
      s.sent = s.received = false;
      progress = true;
    }
    return progress;
  }

  void applyRecv(RankState& s, int r, const Step& st, std::vector<Sym>& in) {
    if (st.action == RecvAction::kReduceToSlot) {
      auto operand = read(s, r, st.operand);
      if (operand.size() != in.size())
        fail(r, "operand size differs from message");
      if (st.finalize)
        fail(r, "finalizes a reduction kept in a slot");
      for (size_t i = 0; i < in.size(); ++i)
        in[i] = combine(r, operand[i], in[i]);
      return;
    }
    if (st.dst.count != in.size())
      fail(r, "destination size differs from message");
    auto& out = buffer(s, st.dst.buffer);
    if (st.dst.offset + st.dst.count > out.size())
      fail(r, "destination outside its buffer");
    std::vector<Sym> operand;
    if (st.action == RecvAction::kReduceWith)
      operand = read(s, r, st.operand);
    for (size_t i = 0; i < in.size(); ++i) {
      Sym& d = out[st.dst.offset + i];
      switch (st.action) {
        case RecvAction::kCopy:
          d = in[i];
          break;
        case RecvAction::kReduce:
          d = combine(r, d, in[i]);
          break;
        case RecvAction::kReduceWith:
          d = combine(r, operand.at(i), in[i]);
          break;
        case RecvAction::kReduceToSlot:
          break;
      }
      if (st.finalize)
        ++d.finalized;
    }
  }

  void simulate() {
    for (;;) {
      bool progress = false, done = true;
      for (int r = 0; r < n_; ++r) {
        progress |= advance(r);
        done &= ranks_[r].step >= ranks_[r].schedule.steps.size();
      }
      if (done)
        break;
      if (!progress) {
        for (int r = 0; r < n_; ++r) {
          if (ranks_[r].step < ranks_[r].schedule.steps.size())
            fail(r, "deadlock: blocked in step " + std::to_string(ranks_[r].step));
        }
      }
    }
    for (auto& [link, q] : links_) {
      if (!q.empty())
        fail(link.first, "sent a message nobody received");
    }
  }

  void expect(int r,
              size_t i,
              const Sym& got,
              int64_t element,
              const std::vector<uint64_t>& mask,
              int finalized) const {
    if (got.element != element || got.mask != mask || got.finalized != finalized) {
      std::ostringstream os;
      os << "recv[" << i << "] holds element " << got.element << " finalized " << got.finalized
         << ", expected element " << element << " with " << (finalized ? "finalized " : "")
         << "contributions " << (mask == full() ? "of all ranks" : "of one rank");
      fail(r, os.str());
    }
  }

  std::vector<uint64_t> full() const {
    std::vector<uint64_t> m((n_ + 63) / 64, 0);
    for (int r = 0; r < n_; ++r)
      m[r / 64] |= uint64_t{1} << (r % 64);
    return m;
  }

  void verify() const {
    // Reductions mark the step where each element's reduction completes (where kAvg divides):
    // exactly once per element with more than one rank, whether or not this call averages.
    const int fin = n_ > 1 ? 1 : 0;
    for (int r = 0; r < n_; ++r) {
      const auto& recv = ranks_[r].recv;
      for (size_t i = 0; i < recv.size(); ++i) {
        switch (kind_) {
          case CollectiveKind::kAllReduce:
            expect(r, i, recv[i], static_cast<int64_t>(i), full(), fin);
            break;
          case CollectiveKind::kReduceScatter:
            expect(r, i, recv[i], static_cast<int64_t>(r * count_ + i), full(), fin);
            break;
          case CollectiveKind::kAllGather:
            expect(r, i, recv[i], static_cast<int64_t>(i % count_),
                   single(static_cast<int>(i / count_)), 0);
            break;
          case CollectiveKind::kBroadcast:
            expect(r, i, recv[i], static_cast<int64_t>(i), single(root_), 0);
            break;
          case CollectiveKind::kReduce:  // off the root, recv is scratch
            if (r == root_)
              expect(r, i, recv[i], static_cast<int64_t>(i), full(), fin);
            break;
          case CollectiveKind::kAllToAll:
            break;  // verifyAllToAll
          case CollectiveKind::kPointToPoint:
            throw Failure{"point-to-point messages have no schedule"};
        }
      }
    }
    if (kind_ == CollectiveKind::kAllToAll) {
      if (layouts_ == nullptr)
        throw Failure{"an all-to-all is checked against its layouts (checkAllToAllSchedules)"};
      verifyAllToAll();
    }
  }

  // Block i of rank r's recv buffer is block r of rank i's send buffer, element for element;
  // what lies between the blocks stays unwritten.
  void verifyAllToAll() const {
    for (int r = 0; r < n_; ++r) {
      const AllToAllLayout& mine = (*layouts_)[r];
      std::vector<bool> covered(ranks_[r].recv.size(), false);
      for (int i = 0; i < n_; ++i) {
        const AllToAllLayout& theirs = (*layouts_)[i];
        for (size_t t = 0; t < mine.recvCounts[i]; ++t) {
          const size_t at = mine.recvDispls[i] + t;
          covered[at] = true;
          expect(r, at, ranks_[r].recv[at], static_cast<int64_t>(theirs.sendDispls[r] + t),
                 single(i), 0);
        }
      }
      for (size_t at = 0; at < covered.size(); ++at) {
        if (!covered[at] && ranks_[r].recv[at].element >= 0)
          fail(r, "writes recv[" + std::to_string(at) + "] outside every block");
      }
    }
  }

  CollectiveKind kind_;
  int n_, root_;
  size_t count_;
  Factory factory_;
  const std::vector<AllToAllLayout>* layouts_;
  std::vector<RankState> ranks_;
  std::map<std::pair<int, int>, std::deque<std::vector<Sym>>> links_;
};

}  // namespace

std::string checkSchedules(
    CollectiveKind kind, int nranks, int root, size_t count, bool averaging, bool twoRankExchange) {
  (void)averaging;  // documents the caller's op; every reduction must finalize exactly once
  return Checker(kind, nranks, root, count,
                 [=](int rank) {
                   return buildSchedule(kind, rank, nranks, root, count, twoRankExchange);
                 })
      .run();
}

std::string checkScheduleSet(CollectiveKind kind,
                             int nranks,
                             int root,
                             size_t count,
                             const std::function<Schedule(int rank)>& factory) {
  try {
    return Checker(kind, nranks, root, count, factory).run();
  } catch (const std::exception& e) {
    return std::string("building the schedules failed: ") + e.what();
  }
}

std::string checkReduceSchedules(ReduceAlgorithm algo, int nranks, int root, size_t count) {
  std::string verdict =
      checkScheduleSet(CollectiveKind::kReduce, nranks, root, count,
                       [&](int rank) { return buildReduce(algo, rank, nranks, root, count); });
  return verdict.empty() ? verdict : std::string(reduceAlgorithmName(algo)) + " " + verdict;
}

std::string checkAllToAllSchedules(const std::vector<AllToAllLayout>& layouts,
                                   const std::function<Schedule(int rank)>& factory) {
  const int n = static_cast<int>(layouts.size());
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < n; ++i) {
      if (layouts[r].sendCounts.at(i) != layouts[i].recvCounts.at(r))
        return "alltoall: rank " + std::to_string(r) + " sends " +
               std::to_string(layouts[r].sendCounts[i]) + " elements to rank " + std::to_string(i) +
               ", which expects " + std::to_string(layouts[i].recvCounts[r]);
    }
  }
  try {
    Checker::Factory build = factory;
    if (!build)
      build = [&](int rank) { return pairwiseAllToAll(rank, n, layouts[rank]); };
    return Checker(CollectiveKind::kAllToAll, n, 0, 0, build, &layouts).run();
  } catch (const std::exception& e) {
    return std::string("building the schedules failed: ") + e.what();
  }
}

std::string checkAllReduceSchedules(Algorithm algo, const Topology& topology, size_t count) {
  std::string verdict =
      checkScheduleSet(CollectiveKind::kAllReduce, topology.nranks(), 0, count,
                       [&](int rank) { return buildAllReduce(algo, rank, topology, count); });
  return verdict.empty() ? verdict : std::string(algorithmName(algo)) + " " + verdict;
}

}  // namespace gs::stream
