// Small messages complete on the receiver's "receive posted" notice (stream/posted_receive.h)
// instead of its credits: over loopback, tcp and shm, 2 ranks as threads. A thousand messages
// each way posted in opposite orders (more than the notice window, past the wrap of the 10-bit
// ordinal, counts on both sides of the 32 KiB limit) arrive intact; a pair that disagrees on the
// count or the dtype still fails on both ranks, with nothing written, whichever end posts first
// (the sender then fails on the notice, or on the receiver's abort).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

// 8192 floats are 32 KiB: the largest message that completes on a notice; 8193 waits for
// credits. Zero and one element are header-only and one-element chunks.
constexpr size_t kCounts[] = {0, 1, 7, 300, 8192, 8193};
constexpr int kMessages = 1100;

size_t countOf(int m) {
  return kCounts[static_cast<size_t>(m) % std::size(kCounts)];
}
float valueOf(int from, int m, size_t i) {
  return static_cast<float>((static_cast<size_t>(from) * 7 + static_cast<size_t>(m) * 3 + i) % 251);
}

class MessageNotices : public ::testing::TestWithParam<const char*> {
 protected:
  RankOptions options() const {
    RankOptions o;
    o.transport = GetParam();
    return o;
  }
};

TEST_P(MessageNotices, ManySmallMessagesPostedInOppositeOrdersArriveIntact) {
  Failures f;
  runRanks(2, options(), [&](int rank, gs_comm_t comm) {
    const int peer = 1 - rank;
    std::vector<std::vector<float>> out(kMessages), in(kMessages);
    std::vector<gs_request_t> reqs;
    auto post = [&](bool send) {
      for (int m = 0; m < kMessages; ++m) {
        gs_request_t r = nullptr;
        const size_t n = countOf(m);
        gs_status_t st;
        if (send) {
          out[m].resize(n);
          for (size_t i = 0; i < n; ++i)
            out[m][i] = valueOf(rank, m, i);
          st = gs_isend(out[m].data(), n, GS_FLOAT32, peer, comm, nullptr, &r);
        } else {
          in[m].assign(n + 1, -1.0f);
          st = gs_irecv(in[m].data(), n, GS_FLOAT32, peer, comm, nullptr, &r);
        }
        if (st != GS_OK)
          return f.add("rank " + std::to_string(rank) + ": post: " + gs_last_error());
        reqs.push_back(r);
      }
    };
    // Rank 0 sends everything before it receives; rank 1 receives first: its notices run far
    // ahead of the messages they name.
    post(rank == 0);
    post(rank != 0);
    for (gs_request_t r : reqs) {
      if (gs_wait(r, -1) != GS_OK)
        f.add("rank " + std::to_string(rank) + ": wait: " + gs_last_error());
      gs_request_free(r);
    }
    for (int m = 0; m < kMessages; ++m) {
      const size_t n = countOf(m);
      for (size_t i = 0; i < n; ++i) {
        if (in[m][i] != valueOf(peer, m, i)) {
          f.add("rank " + std::to_string(rank) + ": message " + std::to_string(m) + " element " +
                std::to_string(i) + " is " + std::to_string(in[m][i]));
          return;
        }
      }
      if (in[m][n] != -1.0f)
        f.add("rank " + std::to_string(rank) + ": message " + std::to_string(m) + " overran");
    }
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

// Rank 0 sends `sent` elements of sendType, rank 1 receives `expected` of recvType; one end
// posts first and the other joins 50 ms later. Returns both ranks' status and message.
struct PairResult {
  gs_status_t status[2] = {GS_OK, GS_OK};
  std::string message[2];
  bool untouched = false;
};
PairResult disagreeingPair(const RankOptions& opt,
                           bool receiverFirst,
                           size_t sent,
                           gs_dtype_t sendType,
                           size_t expected,
                           gs_dtype_t recvType) {
  PairResult res;
  runRanks(2, opt, [&](int rank, gs_comm_t comm) {
    const bool late = (rank == 0) == receiverFirst;
    if (late)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (rank == 0) {
      std::vector<int64_t> buf(sent, 3);
      res.status[0] = gs_send(buf.data(), sent, sendType, 1, comm, nullptr);
    } else {
      std::vector<int64_t> in(expected, -1);
      res.status[1] = gs_recv(in.data(), expected, recvType, 0, comm, nullptr);
      res.untouched = std::all_of(in.begin(), in.end(), [](int64_t v) { return v == -1; });
    }
    res.message[rank] = gs_last_error();
  });
  return res;
}

// Runs disagreeingPair both ways round (receiver first, sender first): both ranks must fail
// with GS_ERR_INVALID_ARGUMENT and every one of `words` in their message, nothing written.
void expectBothRanksFail(const RankOptions& opt,
                         size_t sent,
                         gs_dtype_t sendType,
                         size_t expected,
                         gs_dtype_t recvType,
                         std::initializer_list<const char*> words) {
  for (bool receiverFirst : {true, false}) {
    const PairResult r = disagreeingPair(opt, receiverFirst, sent, sendType, expected, recvType);
    for (int k = 0; k < 2; ++k) {
      SCOPED_TRACE(std::string(receiverFirst ? "receiver first" : "sender first") + ", rank " +
                   std::to_string(k));
      EXPECT_EQ(r.status[k], GS_ERR_INVALID_ARGUMENT) << r.message[k];
      for (const char* w : words)
        EXPECT_NE(r.message[k].find(w), std::string::npos) << r.message[k];
    }
    EXPECT_TRUE(r.untouched);
  }
}

TEST_P(MessageNotices, ACountMismatchFailsBothRanksWhicheverEndPostsFirst) {
  RankOptions opt = options();
  opt.timeoutMs = 5000;
  expectBothRanksFail(opt, 100, GS_FLOAT32, 50, GS_FLOAT32, {"sends 100 elements", "expects 50"});
}

// Over shm a message of at most 4 KiB travels in one of the pair's message boxes, a larger one
// in chunks (stream/engine_boxes.cc): where the counts disagree across that size one end uses
// a box and the other expects chunks. Both still fail, naming the counts, whichever end posts
// first (elsewhere both messages are chunks: the same outcome).
TEST_P(MessageNotices, ACountMismatchAcrossTheBoxSizeFailsBothRanks) {
  RankOptions opt = options();
  opt.timeoutMs = 5000;
  expectBothRanksFail(opt, 8, GS_FLOAT32, 2000, GS_FLOAT32, {"sends 8 elements", "expects 2000"});
  expectBothRanksFail(opt, 2000, GS_FLOAT32, 8, GS_FLOAT32, {"sends 2000 elements", "expects 8"});
}

TEST_P(MessageNotices, ADtypeMismatchOfEqualSizeFailsBothRanks) {
  RankOptions opt = options();
  opt.timeoutMs = 5000;
  expectBothRanksFail(opt, 16, GS_FLOAT32, 16, GS_INT32, {"dtype differs"});
}

// Rank 0 posts a receive from rank 2 (which sends only after 300 ms) and then 552 one-element
// sends to rank 1, all in one run whose in-order reports wait for that receive. Rank 1 takes
// them in batches and then idles for 1.5 s without a call. Rank 0's sends must complete once
// rank 2's message is in, without rank 1's help: they complete per link as notices and credits
// come, so rank 0 keeps rank 1's notices for messages 512-551 (counted from sends reported in
// order, they fell outside the 512 a sender keeps, and rank 1 held the credits of the last
// announced ones until its next call).
TEST_P(MessageNotices, SendsBehindAWaitingReceiveCompleteWhileTheirReceiverIdles) {
  using Clock = std::chrono::steady_clock;
  constexpr int kBatches[] = {100, 100, 100, 100, 100, 12, 40};
  constexpr int kSends = 552;
  constexpr auto kIdle = std::chrono::milliseconds(1500);
  Clock::time_point sendsDone{}, idleFrom{};
  Failures f;
  runRanks(3, options(), [&](int rank, gs_comm_t comm) {
    auto fail = [&](const std::string& what) {
      f.add("rank " + std::to_string(rank) + ": " + what + ": " + gs_last_error());
    };
    std::vector<float> values(kSends, 0.0f);
    if (rank == 0) {
      float from2 = 0;
      std::vector<gs_request_t> reqs(kSends + 1, nullptr);
      if (gs_irecv(&from2, 1, GS_FLOAT32, 2, comm, nullptr, &reqs[0]) != GS_OK)
        return fail("irecv");
      for (int m = 0; m < kSends; ++m) {
        values[m] = static_cast<float>(m);
        if (gs_isend(&values[m], 1, GS_FLOAT32, 1, comm, nullptr, &reqs[m + 1]) != GS_OK)
          return fail("isend");
      }
      for (gs_request_t r : reqs) {
        if (gs_wait(r, -1) != GS_OK)
          fail("wait");
        gs_request_free(r);
      }
      sendsDone = Clock::now();
    } else if (rank == 1) {
      int m = 0;
      for (int batch : kBatches) {
        std::vector<gs_request_t> reqs(batch, nullptr);
        for (int i = 0; i < batch; ++i, ++m) {
          if (gs_irecv(&values[m], 1, GS_FLOAT32, 0, comm, nullptr, &reqs[i]) != GS_OK)
            return fail("irecv");
        }
        for (gs_request_t r : reqs) {
          if (gs_wait(r, -1) != GS_OK)
            fail("wait");
          gs_request_free(r);
        }
      }
      for (int i = 0; i < kSends; ++i) {
        if (values[i] != static_cast<float>(i))
          return f.add("rank 1: message " + std::to_string(i) + " is " + std::to_string(values[i]));
      }
      idleFrom = Clock::now();
      std::this_thread::sleep_for(kIdle);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const float one = 1.0f;
      if (gs_send(&one, 1, GS_FLOAT32, 0, comm, nullptr) != GS_OK)
        fail("send");
    }
    if (gs_barrier(comm) != GS_OK)
      fail("barrier");
  });
  ASSERT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
  // Rank 1 idles until idleFrom + 1.5 s; rank 0's sends were free from about 300 ms in.
  EXPECT_LT(sendsDone, idleFrom + kIdle - std::chrono::milliseconds(500))
      << "rank 0's sends completed only "
      << std::chrono::duration_cast<std::chrono::milliseconds>(sendsDone - idleFrom).count()
      << " ms after rank 1 went idle (for 1500 ms)";
}

// A batch of credits that fills in a call's last round is left to the next call on the link
// (engine_recv.cc, returnCredits): a sender whose receiver comes late still gets it. With 4
// slots of 4 KiB, after small allreduces that leave such batches, one rank sends 64 KiB (16
// chunks, past the 32 KiB a notice completes: it needs every slot back several times) to a
// rank that posts its receive 100 ms later, then the roles swap; all complete intact.
TEST_P(MessageNotices, ALateReceiverStillReturnsTheCreditsItsLastCallLeft) {
  constexpr size_t kCount = 16384;  // 64 KiB of floats
  RankOptions o = options();
  o.slots = 4;
  o.chunkBytes = 4096;
  Failures f;
  runRanks(2, o, [&](int rank, gs_comm_t comm) {
    auto fail = [&](const std::string& what) {
      f.add("rank " + std::to_string(rank) + ": " + what + ": " + gs_last_error());
    };
    for (int sender = 0; sender < 2; ++sender) {
      for (int k = 0; k < 21; ++k) {
        const float mine = static_cast<float>(rank + k);
        float sum = 0;
        if (gs_allreduce(&mine, &sum, 1, GS_FLOAT32, GS_SUM, comm, nullptr) != GS_OK)
          return fail("allreduce");
        if (sum != static_cast<float>(1 + 2 * k))
          return f.add("rank " + std::to_string(rank) + ": allreduce " + std::to_string(k) +
                       " gave " + std::to_string(sum));
      }
      std::vector<float> data(kCount);
      if (rank == sender) {
        for (size_t i = 0; i < kCount; ++i)
          data[i] = valueOf(sender, 5, i);
        if (gs_send(data.data(), kCount, GS_FLOAT32, 1 - rank, comm, nullptr) != GS_OK)
          return fail("send");
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (gs_recv(data.data(), kCount, GS_FLOAT32, 1 - rank, comm, nullptr) != GS_OK)
          return fail("recv");
        for (size_t i = 0; i < kCount; ++i) {
          if (data[i] != valueOf(sender, 5, i))
            return f.add("rank " + std::to_string(rank) + ": element " + std::to_string(i) +
                         " of rank " + std::to_string(sender) + "'s message is wrong");
        }
      }
    }
  });
  ASSERT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         MessageNotices,
                         ::testing::Values("loopback", "tcp", "shm"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param);
                         });

}  // namespace
}  // namespace gs::testing
