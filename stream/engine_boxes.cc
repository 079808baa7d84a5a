// Point-to-point messages in message boxes (transport::Connection::postBox): over shm a message
// of a few KiB is written into one of the pair's boxes and copied out of it by the receiver, with
// no run plan's chunk, header, credit or completion, as the small collectives use the pair's
// mailboxes (engine_small.cc). A 2-rank 8 B sendrecv over shm took 1.0 us through the chunk
// protocol, 0.8 in boxes (OpenMPI's shared memory: 0.2; docs/PERFORMANCE.md §10).
//
// Both ends decide alike whether a message takes a box: from its count (which must agree), the
// link (boxes on both ends or neither) and the configuration. Where the counts disagree across
// the box size one end boxes the message and the other expects chunks; both still fail, naming
// the counts: the receiver expecting chunks finds the message in a box (checkNotInBox), a sender
// whose message the receiver expects in a box sees the receive's notice disagree
// (MessageRun::receiverPosted), and a box that holds another message than the receive expects
// fails it. A boxed send completes once the receiver took the box or posted an agreeing receive:
// a boxed receive says so in the box's receipt as soon as it is listed (expectBoxes), so that in
// a sendrecv each rank's send completes on the peer's receipt, which crosses with the peer's
// box, instead of on the take, which follows the box a crossing later.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "stream/engine_run.h"

namespace gs::stream {
namespace {

// The receiver's words for a box that does not hold what its receive expects.
std::string boxMismatch(
    const transport::BoxArrival& a, uint32_t id, uint64_t count, DataType dtype, int peer, int me) {
  if (a.ordinal != id) {
    return formatString(
        "message sizes differ: rank %d's message #%u to rank %d came where its receive #%u (%llu "
        "elements) was due: the two ranks' counts for one of these messages differ",
        peer, a.ordinal, me, id, static_cast<unsigned long long>(count));
  }
  if (a.dtype != static_cast<uint32_t>(dtype) || !isValid(static_cast<DataType>(a.dtype))) {
    return formatString(
        "dtype differs between ranks: rank %d called with %s, rank %d with %s", peer,
        isValid(static_cast<DataType>(a.dtype)) ? dataTypeName(static_cast<DataType>(a.dtype))
                                                : "an unknown dtype",
        me, dataTypeName(dtype));
  }
  return formatString(
      "message sizes differ: rank %d sends %llu elements to rank %d, whose receive (message #%u "
      "from rank %d) expects %llu",
      peer, static_cast<unsigned long long>(a.count), me, id, peer,
      static_cast<unsigned long long>(count));
}

// Idle rounds a boxed receive waits before it announces itself (announceWaitingBoxes).
constexpr uint32_t kBoxNoticeAfter = 32;

}  // namespace

bool Engine::MessageRun::travelsInBox(const Run::LinkRun& lr, const PointToPointOp& op) const {
  // Raw only: a communicator with a codec sends its float messages encoded, in chunks.
  if (op.count == 0 || base->codec != nullptr || base->adaptive)
    return false;
  const uint64_t bytes = op.count * elementSize(op.dtype);
  return bytes <= static_cast<uint64_t>(std::max<int64_t>(engine.config_.shmSmallBytes, 0)) &&
         bytes <= lr.link->connection().messageBoxBytes();
}

bool Engine::MessageRun::postBoxes() {
  bool progress = false;
  for (size_t li = 0; li < links.size(); ++li) {
    Run::LinkRun& lr = links[li];
    // Box uses go out in their order: the first boxed send not yet posted, if its box is free.
    for (size_t k = sendsDone[li]; k < sendsOf[li].size(); ++k) {
      Message& m = list[sendsOf[li][k]];
      if (!m.boxed || m.posted)
        continue;
      const auto bytes = static_cast<uint32_t>(m.count * elementSize(m.dtype));
      if (!lr.link->connection().postBox(m.box, m.id, static_cast<uint32_t>(m.dtype), m.count,
                                         m.buffer, bytes)) {
        break;
      }
      m.posted = true;
      progress = true;
      if (lr.counters != nullptr)
        lr.counters->onChunkSent(bytes, bytes, static_cast<int>(format::CodecId::kRaw));
    }
  }
  return progress;
}

void Engine::MessageRun::expectBoxes() {
  // A box's next use is expected only once its previous one is taken (the connection says
  // no before that): the loop goes on to the other receives and asks again next round.
  for (size_t i = reported; i < list.size(); ++i) {
    Message& m = list[i];
    if (m.send || !m.boxed || m.done || m.expected)
      continue;
    m.expected = links[m.link].link->connection().expectBox(
        m.box, m.id, static_cast<uint32_t>(m.dtype), m.count);
  }
}

bool Engine::MessageRun::takeBoxes(Run* run) {
  bool progress = false;
  for (size_t i = reported; i < list.size(); ++i) {
    Message& m = list[i];
    if (m.send || !m.boxed || m.done)
      continue;
    Run::LinkRun& lr = links[m.link];
    transport::Connection& connection = lr.link->connection();
    transport::BoxArrival a;
    const transport::BoxPoll state = connection.pollBox(m.box, &a);
    if (state == transport::BoxPoll::kFailed) {
      if (run == nullptr) {
        boxTrouble = true;
        return progress;
      }
      run->connectionFailed(m.link);
    }
    if (state != transport::BoxPoll::kArrived)
      continue;
    const uint64_t bytes = m.count * elementSize(m.dtype);
    if (a.ordinal != m.id || a.count != m.count || a.dtype != static_cast<uint32_t>(m.dtype) ||
        a.bytes != bytes) {
      if (run == nullptr) {
        boxTrouble = true;
        return progress;
      }
      run->fail(Errc::kInvalidArgument, lr.link->peer(),
                boxMismatch(a, m.id, m.count, m.dtype, lr.link->peer(), engine.rank_));
    }
    std::memcpy(m.buffer, a.data, bytes);
    connection.takeBox(m.box);
    m.done = true;
    progress = true;
    if (lr.counters != nullptr)
      lr.counters->onChunkReceived(bytes);
  }
  return progress;
}

void Engine::MessageRun::announceWaitingBoxes() {
  // A boxed receive that has waited kBoxNoticeAfter idle rounds tells its sender, as receives
  // in chunks do at once: a sender that sends that message in chunks (its count is larger)
  // finds the counts differ. Not at once: where the box comes within a few rounds (a sendrecv
  // between ranks on their own cores) the notice cost a tenth of the exchange (2 ranks, 8 B:
  // 0.9 against 0.8 us).
  if (idleRounds != kBoxNoticeAfter)
    return;
  for (size_t i = reported; i < list.size(); ++i) {
    Message& m = list[i];
    if (!m.send && m.boxed && !m.done && !m.announced)
      m.announced = announceReceive(m);
  }
}

void Engine::MessageRun::checkNotInBox(Run& run) {
  // Per link, the first receive expected in chunks that has not completed: a box the peer
  // posted beyond those our receives expect, holding that message, means the counts differ.
  std::vector<bool>& checked = checkedLinks;
  checked.assign(links.size(), false);
  for (size_t i = reported; i < list.size(); ++i) {
    const Message& m = list[i];
    if (m.send || m.boxed || checked[m.link])
      continue;
    checked[m.link] = true;
    Run::LinkRun& lr = links[m.link];
    if (lr.processed >= m.end || lr.link->connection().messageBoxBytes() == 0)
      continue;
    transport::BoxArrival a;
    if (lr.link->connection().boxHolds(lr.link->boxesReceived + 1, m.id, &a)) {
      run.fail(Errc::kInvalidArgument, lr.link->peer(),
               boxMismatch(a, m.id, m.count, m.dtype, lr.link->peer(), engine.rank_));
    }
  }
}

}  // namespace gs::stream
