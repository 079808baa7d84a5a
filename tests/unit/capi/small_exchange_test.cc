// The small-collective path (2 ranks over shm, blocks of at most GS_SHM_SMALL_BYTES swapped
// through the connection's mailboxes, stream/engine_small.cc): the same bits as the chunk
// protocol for allreduce, reduce, reduce-scatter, allgather and all-to-all, every dtype and op,
// in and out of place, and calls that differ between the ranks fail on both, promptly, naming
// the peer. Ranks are threads over real shm connections.
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

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Kind k : {Kind::kAllReduce, Kind::kReduceRoot0, Kind::kReduceRoot1, Kind::kReduceScatter,
                 Kind::kAllGather, Kind::kAllToAll}) {
    const bool reduces = k != Kind::kAllGather && k != Kind::kAllToAll;
    for (gs_dtype_t t : {GS_FLOAT32, GS_FLOAT16, GS_BFLOAT16, GS_FLOAT64, GS_INT32, GS_UINT8}) {
      const size_t e = dtypeSize(t);
      for (gs_redop_t op : {GS_SUM, GS_AVG, GS_PROD, GS_MIN, GS_MAX}) {
        if (!reduces && op != GS_SUM)
          continue;
        // One element, odd counts, the largest block that fits (16 KiB) and one element more.
        for (size_t count : {size_t{1}, size_t{3}, 1001 / e, 16384 / e, 16384 / e + 1})
          out.push_back({k, t, op, count});
      }
    }
  }
  return out;
}

// Random bits, but finite floats of moderate size (products of two stay finite).
std::vector<uint8_t> input(const Case& c, size_t count, std::mt19937& rng) {
  const size_t bytes = count * dtypeSize(c.dtype);
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i)
    v[i] = static_cast<uint8_t>(rng());
  if (c.dtype == GS_FLOAT32 || c.dtype == GS_FLOAT64 || c.dtype == GS_FLOAT16 ||
      c.dtype == GS_BFLOAT16) {
    for (size_t i = 0; i < count; ++i)
      support::storeElement(v.data(), c.dtype, i,
                            static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 7.0);
  }
  return v;
}

// Runs one case on `rank`, in place or not; the bytes its result consists of (nothing for a
// reduce's non-root, whose receive buffer the call leaves alone).
gs_status_t runCase(const Case& c,
                    int rank,
                    gs_comm_t comm,
                    bool inPlace,
                    std::mt19937& rng,
                    std::vector<uint8_t>* result) {
  const size_t block = c.count * dtypeSize(c.dtype);
  const size_t own = static_cast<size_t>(rank) * block;
  switch (c.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceRoot0:
    case Kind::kReduceRoot1: {
      std::vector<uint8_t> send = input(c, c.count, rng), recv(block, 0xee);
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
      std::vector<uint8_t> send = input(c, 2 * c.count, rng), recv(block, 0xee);
      uint8_t* dst = inPlace ? send.data() + own : recv.data();
      const gs_status_t s =
          gs_reduce_scatter(send.data(), dst, c.count, c.dtype, c.op, comm, nullptr);
      result->assign(dst, dst + block);
      return s;
    }
    case Kind::kAllGather: {
      std::vector<uint8_t> mine = input(c, c.count, rng), recv(2 * block, 0xee);
      if (inPlace)
        std::memcpy(recv.data() + own, mine.data(), block);
      const gs_status_t s = gs_allgather(inPlace ? recv.data() + own : mine.data(), recv.data(),
                                         c.count, c.dtype, comm, nullptr);
      *result = recv;
      return s;
    }
    case Kind::kAllToAll: {
      std::vector<uint8_t> send = input(c, 2 * c.count, rng), recv(2 * block, 0xee);
      uint8_t* dst = inPlace ? send.data() : recv.data();
      const gs_status_t s = gs_alltoall(send.data(), dst, c.count, c.dtype, comm, nullptr);
      result->assign(dst, dst + 2 * block);
      return s;
    }
  }
  return GS_ERR_INTERNAL;
}

// Every case, on both ranks, in place for odd case numbers: rank r's results, concatenated,
// and the algorithm each call reported.
struct Outcome {
  std::vector<uint8_t> bytes[2];
  std::vector<std::string> algorithms[2];
};

Outcome runCases(const char* smallBytes) {
  SmallBytesSetting setting(smallBytes);
  RankOptions o;
  o.transport = "shm";
  Outcome out;
  Failures f;
  runRanks(2, o, [&](int rank, gs_comm_t comm) {
    std::mt19937 rng(1234 + rank);
    size_t index = 0;
    for (const Case& c : cases()) {
      std::vector<uint8_t> result;
      if (runCase(c, rank, comm, index++ % 2 == 1, rng, &result) != GS_OK) {
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

TEST(SmallExchange, GivesTheChunkProtocolsBitsForEveryCollectiveDtypeOpAndSize) {
  const Outcome small = runCases("16384");
  const Outcome chunked = runCases("0");
  const std::vector<Case> all = cases();
  ASSERT_EQ(small.algorithms[0].size(), all.size());
  ASSERT_EQ(chunked.algorithms[0].size(), all.size());
  for (size_t k = 0; k < all.size(); ++k) {
    const bool fits = all[k].count * dtypeSize(all[k].dtype) <= 16384;
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(small.algorithms[r][k] == "small_exchange", fits)
          << kindName(all[k].kind) << ", case " << k << " rank " << r;
      EXPECT_NE(chunked.algorithms[r][k], "small_exchange") << "case " << k << " rank " << r;
    }
  }
  // The mailbox path gives exactly what the chunks give, on both ranks (which agree where they
  // hold the same result: the replicated collectives; checked by the reference test suites).
  EXPECT_EQ(small.bytes[0], chunked.bytes[0]);
  EXPECT_EQ(small.bytes[1], chunked.bytes[1]);
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

}  // namespace
}  // namespace gs::testing
