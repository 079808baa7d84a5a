#include "sim/simulate.h"

#include <algorithm>
#include <deque>
#include <map>
#include <vector>

namespace gs::sim {
namespace {

using stream::BufferRange;
using stream::RecvAction;
using stream::Schedule;
using stream::Step;

struct Message {
  double first = 0, last = 0;  // arrival of the first and the last chunk
};

// Times of what a step received (or a buffer range it wrote), for the steps that depend on it.
struct StepTimes {
  double first = 0, done = 0;
};

bool overlaps(const BufferRange& a, const BufferRange& b) {
  return a.buffer == b.buffer && a.count > 0 && b.count > 0 && a.offset < b.offset + b.count &&
         b.offset < a.offset + a.count;
}

}  // namespace

Prediction simulateAllReduce(stream::Algorithm algo,
                             const stream::Topology& topology,
                             double bytes,
                             const stream::CostModel& model,
                             size_t maxSteps) {
  const int n = topology.nranks();
  Prediction out;
  if (n <= 1)
    return out;
  // Elements of 4 bytes; the schedules only need counts.
  const size_t count = std::max<size_t>(1, static_cast<size_t>(bytes / 4));
  const double elementBytes = bytes / static_cast<double>(count);
  const Schedule probe = stream::buildAllReduce(algo, 0, topology, count);
  // The step-by-step run gives every rank a core: ranks outnumbering a host's cores are priced
  // by the closed form, which knows them (cost_model.h).
  if (probe.steps.size() * static_cast<size_t>(n) > maxSteps || topology.crowded()) {
    out.seconds = stream::predictAllReduceSeconds(algo, topology, bytes, model);
    return out;
  }
  std::vector<Schedule> sched;
  sched.reserve(n);
  for (int r = 0; r < n; ++r)
    sched.push_back(stream::buildAllReduce(algo, r, topology, count));

  std::vector<size_t> pc(n, 0);
  std::vector<double> linkFree(n, 0.0);  // when each rank's outgoing link is free again
  std::vector<std::vector<StepTimes>> times(n);
  for (int r = 0; r < n; ++r)
    times[r].resize(sched[r].steps.size());
  std::vector<uint8_t> sent(n, 0);
  std::map<std::pair<int, int>, std::deque<Message>> wires;
  double end = 0;
  auto linkOf = [&](int a, int b) -> const stream::LinkCost& {
    return topology.hostOf[a] == topology.hostOf[b] ? model.intraHost : model.interHost;
  };
  // The latest earlier step (within a window: schedules reuse memory locally) whose receive
  // wrote what `range` covers.
  auto ready = [&](int r, size_t k, const BufferRange& range) {
    StepTimes t;
    const size_t stop = k > 64 ? k - 64 : 0;
    for (size_t j = k; j-- > stop;) {
      const Step& e = sched[r].steps[j];
      if (e.recvPeer >= 0 && e.action != RecvAction::kReduceToSlot && overlaps(e.dst, range))
        return times[r][j];
    }
    return t;
  };
  for (;;) {
    bool progress = false, finished = true;
    for (int r = 0; r < n; ++r) {
      if (pc[r] >= sched[r].steps.size())
        continue;
      finished = false;
      const size_t k = pc[r];
      const Step& st = sched[r].steps[k];
      if (!sent[r]) {
        if (st.sendPeer >= 0) {
          StepTimes data;
          double size;
          if (st.forwards()) {
            const int from = st.forwardedStep(static_cast<int>(k));
            data = times[r][from];
            size = static_cast<double>(sched[r].steps[from].recvCount) * elementBytes;
          } else {
            data = ready(r, k, st.send);
            size = static_cast<double>(st.send.count) * elementBytes;
          }
          const stream::LinkCost& link = linkOf(r, st.sendPeer);
          const double ratio = st.raw ? 1.0 : model.codecRatio;
          const double wire = size * ratio * link.betaSecondsPerByte;
          const double chunk = std::min(size, model.chunkBytes) * ratio * link.betaSecondsPerByte;
          const double start = std::max(data.first, linkFree[r]);
          Message m;
          m.first = start + link.alphaSeconds + chunk;
          m.last =
              std::max(start + link.alphaSeconds + wire, data.done + link.alphaSeconds + chunk);
          linkFree[r] = std::max(start + wire, data.done);
          wires[{r, st.sendPeer}].push_back(m);
        }
        sent[r] = 1;
        progress = true;
      }
      StepTimes& mine = times[r][k];
      if (st.recvPeer >= 0) {
        auto& q = wires[{st.recvPeer, r}];
        if (q.empty())
          continue;
        const Message m = q.front();
        q.pop_front();
        const double size = static_cast<double>(st.recvCount) * elementBytes;
        const bool reduces = st.action != RecvAction::kCopy;
        const double gamma = reduces ? model.gammaSecondsPerByte : 0.0;
        const BufferRange operand =
            st.action == RecvAction::kReduceWith || st.action == RecvAction::kReduceToSlot
                ? st.operand
                : st.dst;
        const StepTimes own = reduces ? ready(r, k, operand) : StepTimes{};
        const double chunkReduce = std::min(size, model.chunkBytes) * gamma;
        mine.first = std::max(m.first, own.first) + chunkReduce;
        mine.done = std::max({m.last + chunkReduce, mine.first + size * gamma, own.done});
        end = std::max(end, mine.done);
      } else {
        mine.first = mine.done = linkFree[r];
      }
      end = std::max(end, linkFree[r]);
      sent[r] = 0;
      ++pc[r];
      progress = true;
    }
    if (finished || !progress)
      break;
  }
  out.seconds = end;
  out.executed = true;
  return out;
}

}  // namespace gs::sim
