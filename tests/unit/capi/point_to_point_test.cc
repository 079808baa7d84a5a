// gs_send, gs_recv, gs_isend, gs_irecv: N ranks as threads over loopback, tcp and shm. Ring
// shifts with every rank posting its send first and messages far larger than the receive slots
// (concurrent progress: no deadlock), several messages per pair in posting order with mixed
// dtypes and counts 0 and 1, peers no schedule linked (links made at the first message),
// blocking ping-pong between collectives, a codec, a pair that disagrees on its count (an
// error on both ranks, nothing written), a peer that never posts (the deadline, naming it),
// and the argument errors.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "tools/support/dtype_elements.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

using support::dtypeSize;
using support::loadElement;
using support::storeElement;

// Small integers: exact in every dtype. from: the sending rank, m: its message number.
double valueOf(int from, int m, size_t i) {
  return static_cast<double>((i * 5 + static_cast<size_t>(from) * 3 + static_cast<size_t>(m)) % 13);
}

std::vector<uint8_t> filled(gs_dtype_t t, size_t count, int from, int m) {
  std::vector<uint8_t> b(count * dtypeSize(t) + 1);
  for (size_t i = 0; i < count; ++i)
    storeElement(b.data(), t, i, valueOf(from, m, i));
  return b;
}

// "" when buf holds message m of rank `from`, else the first difference.
std::string check(const std::vector<uint8_t>& buf, gs_dtype_t t, size_t count, int from, int m) {
  for (size_t i = 0; i < count; ++i) {
    const double got = loadElement(buf.data(), t, i), want = valueOf(from, m, i);
    if (got != want) {
      return "element " + std::to_string(i) + " of message " + std::to_string(m) + " from rank " +
             std::to_string(from) + " is " + std::to_string(got) + ", not " + std::to_string(want);
    }
  }
  return "";
}

// Small chunks and few slots: a message of more than 16 KiB cannot sit in the receiver's slots.
class PointToPoint : public TransportRanksTest {
 protected:
  RankOptions options() const { return chunkedOptions(); }
};

TEST_P(PointToPoint, RingShiftWithEverySendPostedFirst) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    const int to = (rank + 1) % n, from = (rank + n - 1) % n;
    // 300000 floats: 293 chunks of 4 KiB through 4 slots, each way at once.
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{300000}}) {
      std::vector<uint8_t> out = filled(GS_FLOAT32, count, rank, 0);
      std::vector<uint8_t> in(count * 4 + 1, 0xee);
      gs_request_t s = nullptr, r = nullptr;
      if (gs_isend(out.data(), count, GS_FLOAT32, to, comm, nullptr, &s) != GS_OK ||
          gs_irecv(in.data(), count, GS_FLOAT32, from, comm, nullptr, &r) != GS_OK) {
        f.add("rank " + std::to_string(rank) + ": post: " + gs_last_error());
        return;
      }
      if (gs_wait(s, -1) != GS_OK || gs_wait(r, -1) != GS_OK)
        f.add("rank " + std::to_string(rank) + ": " + gs_last_error());
      gs_request_free(s);
      gs_request_free(r);
      const std::string bad = check(in, GS_FLOAT32, count, from, 0);
      if (!bad.empty())
        f.add("rank " + std::to_string(rank) + ", count " + std::to_string(count) + ": " + bad);
      if (in.back() != 0xee)
        f.add("rank " + std::to_string(rank) + ": wrote past the message");
    }
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

// Rank 0 sends three messages (float32, int64, uint8; counts 20000, 0, 1) to every other rank,
// which receives them with blocking calls in the same order and answers each with one message
// of its own. Rank 0 posts everything non-blocking up front: its receives complete only after
// its sends (issue order), which complete as each peer receives.
TEST_P(PointToPoint, MessagesOfOnePairMatchInPostingOrder) {
  const int n = nranks();
  const gs_dtype_t types[] = {GS_FLOAT32, GS_INT64, GS_UINT8};
  const size_t counts[] = {20000, 0, 1};
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    auto fail = [&](const std::string& what) {
      f.add("rank " + std::to_string(rank) + ": " + what + ": " + gs_last_error());
    };
    if (rank == 0) {
      std::vector<std::vector<uint8_t>> outs, ins;
      std::vector<gs_request_t> reqs;
      for (int p = 1; p < n; ++p) {
        for (int m = 0; m < 3; ++m) {
          outs.push_back(filled(types[m], counts[m], 0, m));
          gs_request_t r = nullptr;
          if (gs_isend(outs.back().data(), counts[m], types[m], p, comm, nullptr, &r) != GS_OK)
            return fail("isend");
          reqs.push_back(r);
        }
      }
      for (int p = 1; p < n; ++p) {
        ins.emplace_back(1000 * 8 + 1, 0xee);
        gs_request_t r = nullptr;
        if (gs_irecv(ins.back().data(), 1000, GS_FLOAT64, p, comm, nullptr, &r) != GS_OK)
          return fail("irecv");
        reqs.push_back(r);
      }
      for (gs_request_t r : reqs) {
        if (gs_wait(r, -1) != GS_OK)
          fail("wait");
        gs_request_free(r);
      }
      for (int p = 1; p < n; ++p) {
        const std::string bad = check(ins[p - 1], GS_FLOAT64, 1000, p, 7);
        if (!bad.empty())
          f.add("rank 0: " + bad);
      }
      return;
    }
    for (int m = 0; m < 3; ++m) {
      std::vector<uint8_t> in(counts[m] * dtypeSize(types[m]) + 1, 0xee);
      if (gs_recv(in.data(), counts[m], types[m], 0, comm, nullptr) != GS_OK)
        return fail("recv " + std::to_string(m));
      const std::string bad = check(in, types[m], counts[m], 0, m);
      if (!bad.empty())
        f.add("rank " + std::to_string(rank) + ": " + bad);
    }
    std::vector<uint8_t> out = filled(GS_FLOAT64, 1000, rank, 7);
    if (gs_send(out.data(), 1000, GS_FLOAT64, 0, comm, nullptr) != GS_OK)
      fail("send");
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

// Blocking ping-pong between pairs (2k, 2k+1), with an allreduce on every rank before, between
// and after: the messages and the collectives share the links and the issue order.
TEST_P(PointToPoint, BlockingPingPongBetweenCollectives) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    auto allreduce = [&] {
      std::vector<float> v(5000, 1.0f);
      if (gs_allreduce(v.data(), v.data(), v.size(), GS_FLOAT32, GS_SUM, comm, nullptr) != GS_OK)
        return f.add("allreduce: " + std::string(gs_last_error()));
      if (v[0] != static_cast<float>(n) || v.back() != static_cast<float>(n))
        f.add("rank " + std::to_string(rank) + ": allreduce gave " + std::to_string(v[0]));
    };
    const int partner = rank ^ 1;
    const bool paired = partner < n;
    allreduce();
    for (int round = 0; round < 3 && paired; ++round) {
      std::vector<uint8_t> out = filled(GS_INT32, 7000, rank, round), in(7000 * 4 + 1, 0);
      const bool first = rank % 2 == 0;
      for (int leg = 0; leg < 2; ++leg) {
        const bool sending = (leg == 0) == first;
        const gs_status_t st = sending ? gs_send(out.data(), 7000, GS_INT32, partner, comm, nullptr)
                                       : gs_recv(in.data(), 7000, GS_INT32, partner, comm, nullptr);
        if (st != GS_OK)
          return f.add("rank " + std::to_string(rank) + ": " + gs_last_error());
      }
      const std::string bad = check(in, GS_INT32, 7000, partner, round);
      if (!bad.empty())
        f.add("rank " + std::to_string(rank) + ": " + bad);
      allreduce();
    }
    if (!paired) {
      for (int round = 0; round < 3; ++round)
        allreduce();
    }
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

// A message its issuing thread never waits for, tests or gives a callback still goes out in the
// background: rank 0 posts a send and then blocks outside the library until rank 1's blocking
// receive has it (the progress thread finds the message by itself, kPollPeriod).
TEST_P(PointToPoint, UnwatchedSendProgressesWhileTheIssuerBlocksElsewhere) {
  Failures f;
  std::mutex m;
  std::condition_variable cv;
  bool received = false;
  runRanks(nranks(), options(), [&](int rank, gs_comm_t comm) {
    if (rank > 1)
      return;
    std::vector<uint8_t> buf = filled(GS_INT32, 3000, 0, 0);
    if (rank == 0) {
      gs_request_t s = nullptr;
      if (gs_isend(buf.data(), 3000, GS_INT32, 1, comm, nullptr, &s) != GS_OK) {
        f.add(std::string("isend: ") + gs_last_error());
        return;
      }
      {
        std::unique_lock<std::mutex> lock(m);
        if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return received; }))
          f.add("rank 1 never received the send rank 0 posted and left alone");
      }
      if (gs_wait(s, -1) != GS_OK)
        f.add(std::string("wait: ") + gs_last_error());
      gs_request_free(s);
      return;
    }
    std::vector<uint8_t> in(3000 * 4 + 1, 0);
    if (gs_recv(in.data(), 3000, GS_INT32, 0, comm, nullptr) != GS_OK)
      f.add(std::string("recv: ") + gs_last_error());
    const std::string bad = check(in, GS_INT32, 3000, 0, 0);
    if (!bad.empty())
      f.add(bad);
    {
      std::lock_guard<std::mutex> lock(m);
      received = true;
    }
    cv.notify_all();
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

// A thread that waits runs the queue itself when nobody else does (Communicator::wait): with
// messages and collectives mixed in one queue and several threads waiting for different ones at
// once, every request still completes in issue order, with its data right.
TEST_P(PointToPoint, WaitersOnSeveralThreadsKeepIssueOrder) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    const int to = (rank + 1) % n, from = (rank + n - 1) % n;
    constexpr int kRounds = 3;
    struct Order {
      std::mutex mutex;
      std::vector<int> done;  // indices of the requests, in completion order
    } order;
    struct Tag {
      Order* order;
      int index;
    };
    std::vector<std::vector<uint8_t>> outs, ins;
    std::vector<std::vector<int32_t>> sums(kRounds, std::vector<int32_t>(1000));
    std::vector<std::vector<int32_t>> mine(kRounds);  // read until the allreduce completes
    std::vector<gs_request_t> requests;
    std::vector<Tag> tags;
    tags.reserve(4 * kRounds);
    auto track = [&](gs_request_t r) {
      tags.push_back({&order, static_cast<int>(requests.size())});
      requests.push_back(r);
      gs_request_on_complete(
          r,
          [](gs_status_t, const char*, void* p) {
            auto* t = static_cast<Tag*>(p);
            std::lock_guard<std::mutex> lock(t->order->mutex);
            t->order->done.push_back(t->index);
          },
          &tags.back());
    };
    for (int round = 0; round < kRounds; ++round) {
      outs.push_back(filled(GS_FLOAT32, 5000, rank, round));
      ins.emplace_back(5000 * 4 + 1, 0xee);
      gs_request_t s = nullptr, r = nullptr, a = nullptr;
      mine[round].assign(1000, rank + round);
      if (gs_isend(outs.back().data(), 5000, GS_FLOAT32, to, comm, nullptr, &s) != GS_OK ||
          gs_irecv(ins.back().data(), 5000, GS_FLOAT32, from, comm, nullptr, &r) != GS_OK ||
          gs_iallreduce(mine[round].data(), sums[round].data(), 1000, GS_INT32, GS_SUM, comm,
                        nullptr, &a) != GS_OK) {
        f.add("rank " + std::to_string(rank) + ": post: " + gs_last_error());
        return;
      }
      track(s);
      track(r);
      track(a);
    }
    // Waiters for the last, a middle and the first request at once, then this thread.
    std::vector<std::thread> waiters;
    for (size_t i : {requests.size() - 1, requests.size() / 2, size_t{0}}) {
      waiters.emplace_back([&, i] {
        if (gs_wait(requests[i], -1) != GS_OK)
          f.add("rank " + std::to_string(rank) + ": wait " + std::to_string(i) + ": " +
                gs_last_error());
      });
    }
    for (gs_request_t r : requests) {
      if (gs_wait(r, -1) != GS_OK)
        f.add("rank " + std::to_string(rank) + ": " + gs_last_error());
    }
    for (auto& t : waiters)
      t.join();
    for (gs_request_t r : requests)
      gs_request_free(r);
    // A waiter wakes once the request is done, maybe before its callback has run: wait for all
    // (they write into this frame).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(order.mutex);
        if (order.done.size() == requests.size() || std::chrono::steady_clock::now() > until)
          break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<int> issued(requests.size());
    for (size_t i = 0; i < issued.size(); ++i)
      issued[i] = static_cast<int>(i);
    {
      std::lock_guard<std::mutex> lock(order.mutex);
      if (order.done != issued)
        f.add("rank " + std::to_string(rank) + ": completion order " +
              ::testing::PrintToString(order.done));
    }
    for (int round = 0; round < kRounds; ++round) {
      const std::string bad = check(ins[round], GS_FLOAT32, 5000, from, round);
      if (!bad.empty())
        f.add("rank " + std::to_string(rank) + ": " + bad);
      const int32_t want = n * (n - 1) / 2 + n * round;
      if (sums[round][999] != want)
        f.add("rank " + std::to_string(rank) + ": allreduce " + std::to_string(round) + " gave " +
              std::to_string(sums[round][999]) + ", not " + std::to_string(want));
    }
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         PointToPoint,
                         ::testing::Values(Param{"loopback", 2},
                                           Param{"loopback", 3},
                                           Param{"loopback", 5},
                                           Param{"loopback", 9},
                                           Param{"tcp", 2},
                                           Param{"tcp", 4},
                                           Param{"shm", 2},
                                           Param{"shm", 3}),
                         transportRanksName);

// A bf16 communicator: float messages travel encoded (within bf16's rounding), integers exact.
TEST(PointToPointCodec, FloatsFollowTheCodecIntegersStayExact) {
  RankOptions opt;
  opt.codec = "bf16";
  Failures f;
  runRanks(2, opt, [&](int rank, gs_comm_t comm) {
    const int peer = 1 - rank;
    std::vector<float> fout(50000), fin(50000, -1);
    std::vector<int32_t> iout(50000), iin(50000, -1);
    for (size_t i = 0; i < fout.size(); ++i) {
      fout[i] = 1.0f + static_cast<float>(i) * 1e-3f + static_cast<float>(rank);
      iout[i] = static_cast<int32_t>(i * 1000003u + static_cast<unsigned>(rank));
    }
    gs_request_t r[4];
    if (gs_isend(fout.data(), fout.size(), GS_FLOAT32, peer, comm, nullptr, &r[0]) != GS_OK ||
        gs_isend(iout.data(), iout.size(), GS_INT32, peer, comm, nullptr, &r[1]) != GS_OK ||
        gs_irecv(fin.data(), fin.size(), GS_FLOAT32, peer, comm, nullptr, &r[2]) != GS_OK ||
        gs_irecv(iin.data(), iin.size(), GS_INT32, peer, comm, nullptr, &r[3]) != GS_OK) {
      return f.add(gs_last_error());
    }
    for (gs_request_t q : r) {
      if (gs_wait(q, -1) != GS_OK)
        f.add(gs_last_error());
      gs_request_free(q);
    }
    size_t inexact = 0;
    for (size_t i = 0; i < fin.size(); ++i) {
      const float want = 1.0f + static_cast<float>(i) * 1e-3f + static_cast<float>(peer);
      if (std::fabs(fin[i] - want) > std::fabs(want) / 128) {
        f.add("float " + std::to_string(i) + " is " + std::to_string(fin[i]) + ", not about " +
              std::to_string(want));
        break;
      }
      inexact += fin[i] != want;
      if (iin[i] != static_cast<int32_t>(i * 1000003u + static_cast<unsigned>(peer))) {
        f.add("int32 " + std::to_string(i) + " differs");
        break;
      }
    }
    // bf16 keeps 8 bits of mantissa: most of these values must have been rounded.
    if (inexact < fin.size() / 2)
      f.add("only " + std::to_string(inexact) + " floats were rounded: not sent as bf16?");
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

// Rank 0 sends 100 elements, rank 1 receives 50: both fail, both name both counts, and the
// receive buffer is untouched.
TEST(PointToPointErrors, CountMismatchFailsOnBothRanksAndWritesNothing) {
  RankOptions opt;
  opt.timeoutMs = 3000;
  std::string msg[2];
  gs_status_t st[2] = {GS_OK, GS_OK};
  bool untouched = false;
  runRanks(2, opt, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(100, 3.0f);
    if (rank == 0) {
      st[0] = gs_send(buf.data(), 100, GS_FLOAT32, 1, comm, nullptr);
    } else {
      std::vector<float> in(50, -1.0f);
      st[1] = gs_recv(in.data(), 50, GS_FLOAT32, 0, comm, nullptr);
      untouched = std::all_of(in.begin(), in.end(), [](float v) { return v == -1.0f; });
    }
    msg[rank] = gs_last_error();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], GS_ERR_INVALID_ARGUMENT) << "rank " << r << ": " << msg[r];
    EXPECT_NE(msg[r].find("sends 100 elements"), std::string::npos) << msg[r];
    EXPECT_NE(msg[r].find("expects 50"), std::string::npos) << msg[r];
  }
  EXPECT_TRUE(untouched);
}

// A failure between two ranks that reaches a third while it finishes an earlier call: rank 2
// joins a broadcast late, after ranks 0 and 1 have done their parts of it and then failed a
// send and receive that disagree, so its parent's chunks and that parent's abort message wait
// in one connection. The broadcast completes with the chunks that arrived before the abort
// (they are the whole of it), and rank 2's next call fails with the pair's cause at once.
// (Failing the broadcast too made `dist.all_reduce` fail on an uninvolved rank in CI.)
class AbortAfterTheData : public ::testing::TestWithParam<const char*> {};

TEST_P(AbortAfterTheData, ACallWhoseDataArrivedCompletesTheNextOneFails) {
  RankOptions opt;
  opt.transport = GetParam();
  opt.timeoutMs = 5000;
  std::atomic<int> pairFailed{0};
  std::atomic<bool> thirdDone{false};
  gs_status_t bcast = GS_OK, next = GS_OK;
  std::string bcastMsg, nextMsg;
  bool intact = false;
  double nextSeconds = 0;
  runRanks(3, opt, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(1000, rank == 0 ? 7.0f : -1.0f);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    if (rank == 2) {
      // Both other ranks are past the broadcast and have failed their pair before this joins.
      while (pairFailed.load() < 2 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // their aborts arrive
      bcast = gs_broadcast(buf.data(), buf.data(), buf.size(), GS_FLOAT32, 0, comm, nullptr);
      bcastMsg = gs_last_error();
      intact = std::all_of(buf.begin(), buf.end(), [](float v) { return v == 7.0f; });
      float one = 1.0f;
      const auto start = std::chrono::steady_clock::now();
      next = gs_allreduce(&one, &one, 1, GS_FLOAT32, GS_SUM, comm, nullptr);
      nextSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      nextMsg = gs_last_error();
      thirdDone = true;
      return;
    }
    EXPECT_EQ(gs_broadcast(buf.data(), buf.data(), buf.size(), GS_FLOAT32, 0, comm, nullptr), GS_OK)
        << "rank " << rank << ": " << gs_last_error();
    std::vector<float> msg(rank == 0 ? 100 : 50);
    const gs_status_t st = rank == 0 ? gs_send(msg.data(), 100, GS_FLOAT32, 1, comm, nullptr)
                                     : gs_recv(msg.data(), 50, GS_FLOAT32, 0, comm, nullptr);
    EXPECT_EQ(st, GS_ERR_INVALID_ARGUMENT) << "rank " << rank << ": " << gs_last_error();
    ++pairFailed;
    // Connections stay open until rank 2 is done: what it reads is the abort, not a close.
    while (!thirdDone.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  EXPECT_EQ(bcast, GS_OK) << bcastMsg;
  EXPECT_TRUE(intact) << "the broadcast's data did not arrive whole on rank 2";
  EXPECT_EQ(next, GS_ERR_INVALID_ARGUMENT) << nextMsg;
  EXPECT_NE(nextMsg.find("allreduce #"), std::string::npos) << nextMsg;
  EXPECT_NE(nextMsg.find("sends 100 elements"), std::string::npos) << nextMsg;
  EXPECT_NE(nextMsg.find("detected by rank"), std::string::npos) << nextMsg;
  EXPECT_LT(nextSeconds, 1.0) << "the next call must fail at once, not at its deadline";
}

// The other side of it: rank 0 gives up inside a collective (gs_comm_abort) after its chunk
// left, and rank 1 joins that collective only then: the chunk and the abort wait for it in one
// connection. Rank 0 completed no collective, so rank 1's fails too, rather than completing a
// collective that failed on rank 0.
TEST_P(AbortAfterTheData, ACollectiveThePeerGaveUpInFailsThoughItsDataArrived) {
  RankOptions opt;
  opt.transport = GetParam();
  opt.timeoutMs = 5000;
  std::atomic<bool> zeroFailed{false}, oneDone{false};
  gs_status_t zero = GS_OK, one = GS_OK;
  std::string oneMsg;
  runRanks(2, opt, [&](int rank, gs_comm_t comm) {
    std::vector<float> buf(1000, 1.0f);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    if (rank == 0) {
      std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        gs_comm_abort(comm);
      });
      zero = gs_allreduce(buf.data(), buf.data(), buf.size(), GS_FLOAT32, GS_SUM, comm, nullptr);
      aborter.join();
      zeroFailed = true;
      while (!oneDone.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    while (!zeroFailed.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    one = gs_allreduce(buf.data(), buf.data(), buf.size(), GS_FLOAT32, GS_SUM, comm, nullptr);
    oneMsg = gs_last_error();
    oneDone = true;
  });
  EXPECT_EQ(zero, GS_ERR_ABORTED);
  EXPECT_TRUE(one == GS_ERR_ABORTED || one == GS_ERR_REMOTE) << gs_status_string(one) << oneMsg;
  EXPECT_NE(oneMsg.find("rank 0"), std::string::npos) << oneMsg;
}

// Named like transportRanksName ("shm_3ranks"): the verbs run in the VM leaves out */shm_*.
INSTANTIATE_TEST_SUITE_P(Transports,
                         AbortAfterTheData,
                         ::testing::Values("loopback", "tcp", "shm"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param) + "_3ranks";
                         });

// A receive of 10 floats whose sender never posts fails at the deadline (1 s plus the liveness
// grace) naming the sender, and writes nothing into the buffer.
void expectASilentSenderNamedAtTheDeadline(const char* transport) {
  RankOptions opt;
  opt.transport = transport;
  opt.timeoutMs = 1000;
  std::string msg;
  gs_status_t st = GS_OK;
  double seconds = 0;
  runRanks(2, opt, [&](int rank, gs_comm_t comm) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(4000));
      return;
    }
    std::vector<float> in(10, -1.0f);
    const auto start = std::chrono::steady_clock::now();
    st = gs_recv(in.data(), 10, GS_FLOAT32, 1, comm, nullptr);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    msg = gs_last_error();
    for (float v : in)
      EXPECT_EQ(v, -1.0f) << "a failed receive writes nothing";
  });
  EXPECT_EQ(st, GS_ERR_TIMEOUT) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_LT(seconds, 3.5) << "the deadline is 1 s plus the liveness grace";
}

TEST(PointToPointErrors, APeerThatNeverSendsIsNamedAtTheDeadline) {
  expectASilentSenderNamedAtTheDeadline("loopback");
}

// The same over shm, where the 40 bytes travel in a message box: the run spins on the box
// alone first (MessageRun::runBoxed), then hands the wait to the progress loop, whose deadline
// holds.
TEST(PointToPointErrors, ABoxedReceiveWhosePeerNeverSendsIsNamedAtTheDeadlineOverShm) {
  expectASilentSenderNamedAtTheDeadline("shm");
}

TEST(PointToPointErrors, BadArgumentsNameTheArgumentAndLeaveTheCommunicatorUsable) {
  Failures f;
  runRanks(2, RankOptions{}, [&](int rank, gs_comm_t comm) {
    float v[4] = {1, 2, 3, 4};
    gs_request_t r = nullptr;
    auto expect = [&](gs_status_t st, const char* fragment) {
      const std::string m = gs_last_error();
      if (st != GS_ERR_INVALID_ARGUMENT || m.find(fragment) == std::string::npos)
        f.add("status " + std::to_string(st) + " '" + m + "', expected '" + fragment + "'");
    };
    expect(gs_send(v, 4, GS_FLOAT32, 2, comm, nullptr), "peer 2");
    expect(gs_send(v, 4, GS_FLOAT32, -1, comm, nullptr), "peer -1");
    expect(gs_recv(v, 4, GS_FLOAT32, rank, comm, nullptr), "not another rank");
    expect(gs_isend(nullptr, 4, GS_FLOAT32, 1 - rank, comm, nullptr, &r), "buff is NULL");
    expect(gs_irecv(v, 4, GS_FLOAT32, 1 - rank, comm, nullptr, nullptr), "out_request");
    expect(gs_send(v, 4, static_cast<gs_dtype_t>(77), 1 - rank, comm, nullptr), "dtype");
    // Still usable: one exchange.
    float in[4] = {0, 0, 0, 0};
    gs_request_t s = nullptr;
    if (gs_isend(v, 4, GS_FLOAT32, 1 - rank, comm, nullptr, &s) != GS_OK ||
        gs_recv(in, 4, GS_FLOAT32, 1 - rank, comm, nullptr) != GS_OK || gs_wait(s, -1) != GS_OK) {
      f.add(gs_last_error());
    }
    gs_request_free(s);
    if (in[3] != 4)
      f.add("exchange after the errors gave " + std::to_string(in[3]));
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

}  // namespace
}  // namespace gs::testing
