// The small-collective path (ranks of one host over shm, blocks swapped through the
// connections' mailboxes while what a rank posts in all is at most GS_SHM_SMALL_BYTES,
// stream/engine_small.cc): the same bits as the chunk protocol for allreduce, reduce (2 ranks),
// reduce-scatter, allgather and all-to-all, every dtype and op, in and out of place, for 2 to 6
// ranks; calls that differ between the ranks fail on all, promptly, naming the peer.
// Ranks are threads over real shm connections.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "tools/support/dtype_elements.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

using support::dtypeSize;

std::string lastAlgorithm(gs_comm_t comm) {
  gs_comm_stats_t st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  return gs_comm_stats(comm, &st) == GS_OK ? st.last_algorithm : "?";
}

// GS_SHM_SMALL_BYTES for the communicators made while it lives (read at init).
struct SmallBytesSetting {
  explicit SmallBytesSetting(const char* value) { setenv("GS_SHM_SMALL_BYTES", value, 1); }
  ~SmallBytesSetting() { unsetenv("GS_SHM_SMALL_BYTES"); }
};

enum class Kind { kAllReduce, kReduceRoot0, kReduceRoot1, kReduceScatter, kAllGather, kAllToAll };
const char* kindName(Kind k) {
  static const char* const names[] = {"allreduce",      "reduce(root 0)", "reduce(root 1)",
                                      "reduce_scatter", "allgather",      "alltoall"};
  return names[static_cast<int>(k)];
}

struct Case {
  Kind kind;
  gs_dtype_t dtype;
  gs_redop_t op;
  size_t count;  // what one rank sends the other: a block (the whole buffer for the reductions)
};

bool reduces(Kind k) {
  return k != Kind::kAllGather && k != Kind::kAllToAll;
}
bool rooted(Kind k) {
  return k == Kind::kReduceRoot0 || k == Kind::kReduceRoot1;
}

std::vector<Case> cases(int nranks) {
  std::vector<Case> out;
  const auto peers = static_cast<size_t>(nranks - 1);
  for (Kind k : {Kind::kAllReduce, Kind::kReduceRoot0, Kind::kReduceRoot1, Kind::kReduceScatter,
                 Kind::kAllGather, Kind::kAllToAll}) {
    for (gs_dtype_t t : {GS_FLOAT32, GS_FLOAT16, GS_BFLOAT16, GS_FLOAT64, GS_INT32, GS_UINT8}) {
      const size_t e = dtypeSize(t);
      for (gs_redop_t op : {GS_SUM, GS_AVG, GS_PROD, GS_MIN, GS_MAX}) {
        if (!reduces(k) && op != GS_SUM)
          continue;
        // One element, odd counts, the largest block that fits (a rank posts one per peer: 16
        // KiB in all; an allreduce the whole buffer to one partner at a time) and one more.
        const size_t largest = 16384 / e / (k == Kind::kAllReduce ? 1 : peers);
        for (size_t count : {size_t{1}, size_t{3}, 1001 / e, largest, largest + 1})
          out.push_back({k, t, op, count});
      }
    }
  }
  return out;
}

// Whether the case takes the mailboxes: all it posts fits, and (more than 2 ranks) it is not
// a reduce, whose root alone would wait. An allreduce posts its whole buffer to one partner
// per round (recursive doubling), the others a block to every peer.
bool fitsMailboxes(const Case& c, int nranks) {
  const size_t bytes = c.count * dtypeSize(c.dtype);
  if (c.kind == Kind::kAllReduce)
    return bytes <= 16384;
  return bytes * static_cast<size_t>(nranks - 1) <= 16384 && (nranks == 2 || !rooted(c.kind));
}

// Random bits, but finite floats. Two ranks: of moderate size (products of two stay finite).
// More: +-1/2, 1 or 2, whose sums, averages and products over up to 4 ranks are exact in every
// float format, so the result does not depend on the order the path reduces in (the mailboxes
// go in rank order, the chunk protocol's schedules another way).
std::vector<uint8_t> input(const Case& c, size_t count, int nranks, std::mt19937& rng) {
  const size_t bytes = count * dtypeSize(c.dtype);
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i)
    v[i] = static_cast<uint8_t>(rng());
  if (c.dtype == GS_FLOAT32 || c.dtype == GS_FLOAT64 || c.dtype == GS_FLOAT16 ||
      c.dtype == GS_BFLOAT16) {
    static const double kExact[] = {-2.0, -1.0, -0.5, 0.5, 1.0, 2.0};
    for (size_t i = 0; i < count; ++i) {
      const double x = nranks == 2
                           ? static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 7.0
                           : kExact[rng() % 6];
      support::storeElement(v.data(), c.dtype, i, x);
    }
  }
  return v;
}

// Runs one case on `rank` of `nranks`, in place or not; the bytes its result consists of
// (nothing for a reduce's non-root, whose receive buffer the call leaves alone).
gs_status_t runCase(const Case& c,
                    int rank,
                    int nranks,
                    gs_comm_t comm,
                    bool inPlace,
                    std::mt19937& rng,
                    std::vector<uint8_t>* result) {
  const size_t block = c.count * dtypeSize(c.dtype);
  const size_t own = static_cast<size_t>(rank) * block;
  const auto n = static_cast<size_t>(nranks);
  switch (c.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceRoot0:
    case Kind::kReduceRoot1: {
      std::vector<uint8_t> send = input(c, c.count, nranks, rng), recv(block, 0xee);
      void* dst = inPlace ? send.data() : recv.data();
      const int root = c.kind == Kind::kReduceRoot1 ? 1 : 0;
      const gs_status_t s =
          c.kind == Kind::kAllReduce
              ? gs_allreduce(send.data(), dst, c.count, c.dtype, c.op, comm, nullptr)
              : gs_reduce(send.data(), dst, c.count, c.dtype, c.op, root, comm, nullptr);
      if (c.kind == Kind::kAllReduce || rank == root)
        result->assign(static_cast<uint8_t*>(dst), static_cast<uint8_t*>(dst) + block);
      return s;
    }
    case Kind::kReduceScatter: {
      std::vector<uint8_t> send = input(c, n * c.count, nranks, rng), recv(block, 0xee);
      uint8_t* dst = inPlace ? send.data() + own : recv.data();
      const gs_status_t s =
          gs_reduce_scatter(send.data(), dst, c.count, c.dtype, c.op, comm, nullptr);
      result->assign(dst, dst + block);
      return s;
    }
    case Kind::kAllGather: {
      std::vector<uint8_t> mine = input(c, c.count, nranks, rng), recv(n * block, 0xee);
      if (inPlace)
        std::memcpy(recv.data() + own, mine.data(), block);
      const gs_status_t s = gs_allgather(inPlace ? recv.data() + own : mine.data(), recv.data(),
                                         c.count, c.dtype, comm, nullptr);
      *result = recv;
      return s;
    }
    case Kind::kAllToAll: {
      std::vector<uint8_t> send = input(c, n * c.count, nranks, rng), recv(n * block, 0xee);
      uint8_t* dst = inPlace ? send.data() : recv.data();
      const gs_status_t s = gs_alltoall(send.data(), dst, c.count, c.dtype, comm, nullptr);
      result->assign(dst, dst + n * block);
      return s;
    }
  }
  return GS_ERR_INTERNAL;
}

// Every case, on every rank, in place for odd case numbers: rank r's results, concatenated,
// and the algorithm each call reported.
struct Outcome {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<std::string>> algorithms;
};

Outcome runCases(int nranks, const char* smallBytes) {
  SmallBytesSetting setting(smallBytes);
  RankOptions o;
  o.transport = "shm";
  Outcome out;
  out.bytes.resize(nranks);
  out.algorithms.resize(nranks);
  Failures f;
  runRanks(nranks, o, [&](int rank, gs_comm_t comm) {
    std::mt19937 rng(1234 + rank);
    size_t index = 0;
    for (const Case& c : cases(nranks)) {
      std::vector<uint8_t> result;
      if (runCase(c, rank, nranks, comm, index++ % 2 == 1, rng, &result) != GS_OK) {
        f.add(std::string(kindName(c.kind)) + ": " + gs_last_error());
        return;
      }
      out.bytes[rank].insert(out.bytes[rank].end(), result.begin(), result.end());
      out.algorithms[rank].push_back(lastAlgorithm(comm));
    }
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
  return out;
}

// The mailbox path gives exactly what the chunks give, on every rank (the replicated
// collectives' ranks agree with each other: checked by the reference test suites), and is
// taken exactly where the call fits.
void expectSameBitsAsTheChunks(int nranks) {
  const Outcome small = runCases(nranks, "16384");
  const Outcome chunked = runCases(nranks, "0");
  const std::vector<Case> all = cases(nranks);
  for (int r = 0; r < nranks; ++r) {
    ASSERT_EQ(small.algorithms[r].size(), all.size()) << "rank " << r;
    ASSERT_EQ(chunked.algorithms[r].size(), all.size()) << "rank " << r;
    for (size_t k = 0; k < all.size(); ++k) {
      EXPECT_EQ(small.algorithms[r][k] == "small_exchange", fitsMailboxes(all[k], nranks))
          << kindName(all[k].kind) << ", case " << k << " rank " << r << " of " << nranks;
      EXPECT_NE(chunked.algorithms[r][k], "small_exchange") << "case " << k << " rank " << r;
    }
    EXPECT_EQ(small.bytes[r], chunked.bytes[r]) << "rank " << r << " of " << nranks;
  }
}

TEST(SmallExchange, GivesTheChunkProtocolsBitsForEveryCollectiveDtypeOpAndSize) {
  expectSameBitsAsTheChunks(2);
}

// More ranks post a block to every peer's mailbox and wait for all of theirs (reduce-scatter
// reduces in rank order), an allreduce swaps with one partner per round (recursive doubling;
// ranks past the largest power of two hand their value to a partner first and get the result
// back: 3, 5 and 6 ranks); reduce keeps the chunks.
TEST(SmallExchange, ThreeToSixRanksGiveTheChunkProtocolsBits) {
  for (int n : {3, 4, 5, 6})
    expectSameBitsAsTheChunks(n);
}

// Both ranks run body(rank, comm); each call's status and message, and how long it all took.
struct Mismatch {
  gs_status_t status[2] = {GS_OK, GS_OK};
  std::string message[2];
  double seconds = 0;
};

Mismatch runMismatch(int64_t timeoutMs, const std::function<gs_status_t(int, gs_comm_t)>& body) {
  RankOptions o;
  o.transport = "shm";
  o.timeoutMs = timeoutMs;
  Mismatch m;
  const auto start = std::chrono::steady_clock::now();
  runRanks(2, o, [&](int rank, gs_comm_t comm) {
    m.status[rank] = body(rank, comm);
    m.message[rank] = gs_last_error();
  });
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

void expectBothFailNamingThePeer(const Mismatch& m, const char* what) {
  int invalid = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(m.status[r] == GS_ERR_INVALID_ARGUMENT || m.status[r] == GS_ERR_REMOTE)
        << what << ", rank " << r << ": " << gs_status_string(m.status[r]) << " " << m.message[r];
    EXPECT_NE(m.message[r].find("rank " + std::to_string(1 - r)), std::string::npos)
        << what << ", rank " << r << ": " << m.message[r];
    invalid += m.status[r] == GS_ERR_INVALID_ARGUMENT;
  }
  EXPECT_GE(invalid, 1) << what << ": no rank reported the mismatch itself";
}

TEST(SmallExchange, CallsThatDifferFailOnBothRanksPromptly) {
  // Two small calls of different counts, dtypes or ops: the tags differ.
  const Mismatch counts = runMismatch(20000, [](int rank, gs_comm_t comm) {
    float v[3] = {1, 2, 3};
    return gs_allreduce(v, v, rank == 0 ? 2 : 3, GS_FLOAT32, GS_SUM, comm, nullptr);
  });
  expectBothFailNamingThePeer(counts, "counts 2 and 3");
  EXPECT_NE(counts.message[0].find("count differs"), std::string::npos) << counts.message[0];
  EXPECT_LT(counts.seconds, 4.0);

  const Mismatch ops = runMismatch(20000, [](int rank, gs_comm_t comm) {
    float v[2] = {1, 2};
    return gs_allreduce(v, v, 2, GS_FLOAT32, rank == 0 ? GS_SUM : GS_MAX, comm, nullptr);
  });
  expectBothFailNamingThePeer(ops, "sum and max");
  EXPECT_LT(ops.seconds, 4.0);

  // A small call against a chunked one (1 MiB): the chunked rank sees the peer's mailbox.
  const Mismatch sizes = runMismatch(20000, [](int rank, gs_comm_t comm) {
    std::vector<float> v(rank == 0 ? 2 : 256 * 1024, 1.f);
    return gs_allreduce(v.data(), v.data(), v.size(), GS_FLOAT32, GS_SUM, comm, nullptr);
  });
  expectBothFailNamingThePeer(sizes, "2 and 262144 elements");
  EXPECT_LT(sizes.seconds, 4.0);

  // A small allreduce against a small broadcast (no mailbox path for broadcast).
  const Mismatch kinds = runMismatch(20000, [](int rank, gs_comm_t comm) {
    float v[2] = {1, 2};
    return rank == 0 ? gs_allreduce(v, v, 2, GS_FLOAT32, GS_SUM, comm, nullptr)
                     : gs_broadcast(v, v, 2, GS_FLOAT32, 0, comm, nullptr);
  });
  expectBothFailNamingThePeer(kinds, "allreduce and broadcast");
  EXPECT_LT(kinds.seconds, 4.0);

  // Two small collectives of different kinds, and reduces to different roots.
  const Mismatch gather = runMismatch(20000, [](int rank, gs_comm_t comm) {
    float v[2] = {1, 2}, out[4];
    return rank == 0 ? gs_allreduce(v, out, 2, GS_FLOAT32, GS_SUM, comm, nullptr)
                     : gs_allgather(v, out, 2, GS_FLOAT32, comm, nullptr);
  });
  expectBothFailNamingThePeer(gather, "allreduce and allgather");
  EXPECT_NE(gather.message[0].find("collective differs"), std::string::npos) << gather.message[0];
  const Mismatch roots = runMismatch(20000, [](int rank, gs_comm_t comm) {
    float v[2] = {1, 2}, out[2];
    return gs_reduce(v, out, 2, GS_FLOAT32, GS_SUM, rank, comm, nullptr);
  });
  expectBothFailNamingThePeer(roots, "roots 0 and 1");
  EXPECT_NE(roots.message[0].find("root differs"), std::string::npos) << roots.message[0];
  EXPECT_LT(gather.seconds + roots.seconds, 4.0);
}

TEST(SmallExchange, APeerThatNeverCallsTimesOutNamingItAndLearnsOfIt) {
  const Mismatch m = runMismatch(1000, [](int rank, gs_comm_t comm) {
    float v[2] = {1, 2};
    if (rank == 1)
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past rank 0's timeout
    return gs_allreduce(v, v, 2, GS_FLOAT32, GS_SUM, comm, nullptr);
  });
  EXPECT_EQ(m.status[0], GS_ERR_TIMEOUT) << m.message[0];
  EXPECT_NE(m.message[0].find("rank 1"), std::string::npos) << m.message[0];
  // Rank 1 comes late: it learns at once that rank 0 gave up on it (its cause, passed on),
  // instead of waiting a timeout of its own ("rank 0 sent nothing ...").
  EXPECT_EQ(m.status[1], GS_ERR_TIMEOUT) << m.message[1];
  EXPECT_NE(m.message[1].find("rank 0 reported this rank at fault: rank 1 sent nothing"),
            std::string::npos)
      << m.message[1];
  EXPECT_LT(m.seconds, 10.0);
}

// Three ranks, one of which calls differently or late: every rank fails, promptly, and those
// that were right name the odd one.
struct GroupOutcome {
  std::vector<gs_status_t> status;
  std::vector<std::string> message;
  double seconds = 0;
};

GroupOutcome runGroup(int nranks,
                      int64_t timeoutMs,
                      const std::function<gs_status_t(int, gs_comm_t)>& body) {
  RankOptions o;
  o.transport = "shm";
  o.timeoutMs = timeoutMs;
  GroupOutcome g;
  g.status.assign(nranks, GS_OK);
  g.message.resize(nranks);
  const auto start = std::chrono::steady_clock::now();
  runRanks(nranks, o, [&](int rank, gs_comm_t comm) {
    g.status[rank] = body(rank, comm);
    g.message[rank] = gs_last_error();
  });
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return g;
}

TEST(SmallExchange, AThirdRankThatCallsDifferentlyFailsEveryRankNamingIt) {
  const GroupOutcome g = runGroup(3, 20000, [](int rank, gs_comm_t comm) {
    float v[3] = {1, 2, 3}, out[9];
    return gs_allgather(v, out, rank == 2 ? 3 : 2, GS_FLOAT32, comm, nullptr);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(g.status[r] == GS_ERR_INVALID_ARGUMENT || g.status[r] == GS_ERR_REMOTE)
        << "rank " << r << ": " << gs_status_string(g.status[r]) << " " << g.message[r];
  }
  // Ranks 0 and 1 find rank 2's count in its mailbox, or learn of it from each other or from
  // rank 2 (its own words: "rank 0 called with 2, rank 2 with 3").
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(g.status[r], GS_ERR_INVALID_ARGUMENT) << "rank " << r << ": " << g.message[r];
    EXPECT_NE(g.message[r].find("count differs between ranks"), std::string::npos)
        << "rank " << r << ": " << g.message[r];
    EXPECT_NE(g.message[r].find("rank 2"), std::string::npos)
        << "rank " << r << ": " << g.message[r];
  }
  EXPECT_LT(g.seconds, 4.0);
}

// Recursive doubling on 3 ranks: rank 2 hands its value to rank 0 only; rank 1 swaps with
// rank 0. Rank 2 calling with another count fails rank 0 on its mailbox and rank 1, which
// never hears from rank 2, through rank 0's notice; each names rank 2.
TEST(SmallExchange, AnAllReduceWhoseFoldedRankCallsDifferentlyFailsEveryRankNamingIt) {
  const GroupOutcome g = runGroup(3, 20000, [](int rank, gs_comm_t comm) {
    float v[3] = {1, 2, 3};
    return gs_allreduce(v, v, rank == 2 ? 3 : 2, GS_FLOAT32, GS_SUM, comm, nullptr);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(g.status[r] == GS_ERR_INVALID_ARGUMENT || g.status[r] == GS_ERR_REMOTE)
        << "rank " << r << ": " << gs_status_string(g.status[r]) << " " << g.message[r];
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(g.message[r].find("count differs between ranks"), std::string::npos)
        << "rank " << r << ": " << g.message[r];
    EXPECT_NE(g.message[r].find("rank 2"), std::string::npos)
        << "rank " << r << ": " << g.message[r];
  }
  EXPECT_LT(g.seconds, 4.0);
}

// A rank that completed a small call and failed in its next one did not fail the first: on 3
// ranks the folded rank 2 reads rank 0's result last, perhaps after rank 0, done with the
// allreduce, failed a send to rank 1. Rank 2's allreduce stands (in 2026-12-05's first
// version it failed now and then with "message sizes differ", which was rank 0's next call).
TEST(SmallExchange, AFailureInTheNextCallLeavesACompletedExchangeStanding) {
  for (int round = 0; round < 10; ++round) {
    std::vector<float> sums(3, 0.f);
    const GroupOutcome g = runGroup(3, 20000, [&](int rank, gs_comm_t comm) {
      float v = static_cast<float>(rank + 1);
      if (gs_allreduce(&v, &v, 1, GS_FLOAT32, GS_SUM, comm, nullptr) != GS_OK)
        return GS_ERR_INTERNAL;
      sums[rank] = v;
      int64_t out[4] = {1, 2, 3, 4}, in[5];
      if (rank == 0)
        return gs_send(out, 4, GS_INT64, 1, comm, nullptr);
      if (rank == 1)
        return gs_recv(in, 5, GS_INT64, 0, comm, nullptr);
      return GS_OK;
    });
    ASSERT_EQ(g.status[2], GS_OK) << "round " << round << ": " << g.message[2];
    EXPECT_EQ(sums, std::vector<float>(3, 6.f)) << "round " << round;
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(g.status[r], GS_ERR_INVALID_ARGUMENT) << "round " << round << ": " << g.message[r];
  }
}

TEST(SmallExchange, AThirdRankThatNeverCallsTimesOutTheOthersNamingIt) {
  const GroupOutcome g = runGroup(3, 1000, [](int rank, gs_comm_t comm) {
    float v[6] = {1, 2, 3, 4, 5, 6}, out[6];
    if (rank == 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past the others' timeout
    return gs_alltoall(v, out, 2, GS_FLOAT32, comm, nullptr);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(g.status[r], GS_ERR_TIMEOUT) << "rank " << r << ": " << g.message[r];
    EXPECT_NE(g.message[r].find("rank 2 sent nothing"), std::string::npos)
        << "rank " << r << ": " << g.message[r];
  }
  // Rank 2 comes late and learns that the others gave up on it, instead of waiting a timeout.
  EXPECT_NE(g.status[2], GS_OK) << g.message[2];
  EXPECT_NE(g.message[2].find("reported this rank at fault"), std::string::npos) << g.message[2];
  EXPECT_LT(g.seconds, 10.0);
}

}  // namespace
}  // namespace gs::testing
