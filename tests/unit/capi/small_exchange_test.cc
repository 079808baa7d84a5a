// The small-allreduce path (2 ranks over shm, at most GS_SHM_SMALL_BYTES: the buffers swapped
// through the connection's mailboxes, stream/engine_small.cc): the same bits as the chunk
// protocol for every dtype and op, and calls that differ between the ranks fail on both,
// promptly, naming the peer. Ranks are threads over real shm connections.
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

struct Case {
  gs_dtype_t dtype;
  gs_redop_t op;
  size_t count;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (gs_dtype_t t : {GS_FLOAT32, GS_FLOAT16, GS_BFLOAT16, GS_FLOAT64, GS_INT32, GS_UINT8}) {
    const size_t e = dtypeSize(t);
    for (gs_redop_t op : {GS_SUM, GS_AVG, GS_PROD, GS_MIN, GS_MAX}) {
      // One element, odd counts, the largest call that fits (16 KiB) and one element more.
      for (size_t count : {size_t{1}, size_t{3}, 1001 / e, 16384 / e, 16384 / e + 1})
        out.push_back({t, op, count});
    }
  }
  return out;
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
      const size_t bytes = c.count * dtypeSize(c.dtype);
      std::vector<uint8_t> send(bytes), recv(bytes, 0xee);
      // Random bits, but finite floats of moderate size: products of two stay finite.
      for (size_t i = 0; i < bytes; ++i)
        send[i] = static_cast<uint8_t>(rng());
      if (c.dtype == GS_FLOAT32 || c.dtype == GS_FLOAT64 || c.dtype == GS_FLOAT16 ||
          c.dtype == GS_BFLOAT16) {
        for (size_t i = 0; i < c.count; ++i)
          support::storeElement(send.data(), c.dtype, i,
                                static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 7.0);
      }
      const bool inPlace = index++ % 2 == 1;
      void* dst = inPlace ? send.data() : recv.data();
      if (gs_allreduce(send.data(), dst, c.count, c.dtype, c.op, comm, nullptr) != GS_OK) {
        f.add(std::string("allreduce: ") + gs_last_error());
        return;
      }
      const auto* result = static_cast<const uint8_t*>(dst);
      out.bytes[rank].insert(out.bytes[rank].end(), result, result + bytes);
      out.algorithms[rank].push_back(lastAlgorithm(comm));
    }
  });
  EXPECT_TRUE(f.list.empty()) << f.list.front();
  return out;
}

TEST(SmallExchange, GivesTheChunkProtocolsBitsForEveryDtypeOpAndSize) {
  const Outcome small = runCases("16384");
  const Outcome chunked = runCases("0");
  const std::vector<Case> all = cases();
  ASSERT_EQ(small.algorithms[0].size(), all.size());
  ASSERT_EQ(chunked.algorithms[0].size(), all.size());
  for (size_t k = 0; k < all.size(); ++k) {
    const bool fits = all[k].count * dtypeSize(all[k].dtype) <= 16384;
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(small.algorithms[r][k] == "small_exchange", fits) << "case " << k << " rank " << r;
      EXPECT_NE(chunked.algorithms[r][k], "small_exchange") << "case " << k << " rank " << r;
    }
  }
  // Replicas agree, and the mailbox path gives exactly what the chunks give.
  EXPECT_EQ(small.bytes[0], small.bytes[1]);
  EXPECT_EQ(chunked.bytes[0], chunked.bytes[1]);
  EXPECT_EQ(small.bytes[0], chunked.bytes[0]);
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
