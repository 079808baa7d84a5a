// gs_reduce, gs_alltoall, gs_alltoallv (blocking and non-blocking) and gs_barrier: N ranks as
// threads over loopback, tcp and shm, every dtype, counts of 0, 1, odd and many chunks, every
// reduce algorithm (the cost model's choice, and each of chain, tree and linear through
// GS_REDUCE_ALGO), in place, uneven all-to-all layouts with empty pairs, a pair that disagrees
// on its count, and the argument errors.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
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

constexpr gs_dtype_t kDtypes[] = {GS_FLOAT32, GS_FLOAT64, GS_FLOAT16, GS_BFLOAT16,
                                  GS_INT32,   GS_INT64,   GS_UINT8};

// Small integers: exact in every dtype, and in sums of up to 9 ranks.
double valueOf(int rank, size_t i) {
  return static_cast<double>((i * 3 + static_cast<size_t>(rank) * 7) % 11);
}

// Many chunks per block even for small counts.
class RootedAllToAll : public TransportRanksTest {
 protected:
  RankOptions options() const { return chunkedOptions(); }
};

// Every dtype, root and count in and out of place, with the reduce algorithm `algo`
// (GS_REDUCE_ALGO, read when the communicators are made; "auto": the cost model's per count).
void reduceEveryDtypeRootAndCount(int n, const RankOptions& options, const char* algo) {
  setenv("GS_REDUCE_ALGO", algo, 1);
  Failures f;
  runRanks(n, options, [&](int rank, gs_comm_t comm) {
    for (gs_dtype_t t : kDtypes) {
      const size_t es = dtypeSize(t);
      for (int root : {0, n - 1}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{20000}}) {
          for (bool inPlace : {false, true}) {
            std::vector<uint8_t> send(count * es + 1), recv(count * es + 1, 0xcd);
            for (size_t i = 0; i < count; ++i)
              storeElement(send.data(), t, i, valueOf(rank, i));
            // In place on the root: its input is already in recvbuff.
            const bool inPlaceHere = inPlace && rank == root;
            if (inPlaceHere)
              recv = send;
            const void* in = inPlaceHere ? recv.data() : send.data();
            // Off the root recvbuff may be NULL: every other rank passes NULL, the last one a
            // buffer that must stay untouched.
            void* out = rank == root || rank == n - 1 ? recv.data() : nullptr;
            if (gs_reduce(in, out, count, t, GS_SUM, root, comm, nullptr) != GS_OK) {
              f.add(std::string("gs_reduce: ") + gs_last_error());
              return;
            }
            gs_comm_stats_t st;
            memset(&st, 0, sizeof(st));
            st.struct_size = sizeof(st);
            // (2 ranks over shm swap small blocks through the mailboxes: no schedule.)
            if (n > 1 && count > 0 && strcmp(algo, "auto") != 0 &&
                (gs_comm_stats(comm, &st) != GS_OK ||
                 (strcmp(st.last_algorithm, algo) != 0 &&
                  strcmp(st.last_algorithm, "small_exchange") != 0))) {
              f.add(std::string("ran ") + st.last_algorithm + " for GS_REDUCE_ALGO=" + algo);
              return;
            }
            for (size_t i = 0; i < count; ++i) {
              double want = 0;
              for (int q = 0; q < n; ++q)
                want += valueOf(q, i);
              if (rank == root && loadElement(recv.data(), t, i) != want) {
                f.add("root " + std::to_string(root) + " element " + std::to_string(i) + " dtype " +
                      std::to_string(t) + " count " + std::to_string(count));
                return;
              }
            }
            if (rank != root && out != nullptr && count > 0 && recv[0] != 0xcd)
              f.add("rank " + std::to_string(rank) + " recvbuff written off the root");
          }
        }
      }
    }
  });
  unsetenv("GS_REDUCE_ALGO");
  EXPECT_TRUE(f.list.empty()) << algo << ": " << (f.list.empty() ? std::string() : f.list.front());
}

TEST_P(RootedAllToAll, ReduceEveryDtypeRootAndCountInAndOutOfPlace) {
  reduceEveryDtypeRootAndCount(nranks(), options(), "auto");
}

TEST_P(RootedAllToAll, ReduceByEveryAlgorithm) {
  for (const char* algo : {"chain", "tree", "linear"})
    reduceEveryDtypeRootAndCount(nranks(), options(), algo);
}

// A reduce of a few slots' worth pipelines in pieces (schedules::reduceChunkBytes): a 1 MiB
// buffer goes as 128 KiB chunks (256 KiB over tcp and verbs: the transport the communicator
// reports, which GS_TRANSPORT may set), not one slot-sized chunk, unless the ranks outnumber the
// cores (the ranks here are threads of this process: its CPUs). Exact either way, the last chunk
// short, in and out of place.
TEST_P(RootedAllToAll, AReduceOfAFewSlotsPipelinesInPiecesAndStaysExact) {
  const int n = nranks();
  if (n < 2)
    GTEST_SKIP() << "a lone rank sends nothing";
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const bool crowded = n > CPU_COUNT(&cpus);
  const size_t count = (size_t{1} << 18) + 3;  // float32: 1 MiB and 12 bytes
  RankOptions o = TransportRanksTest::options();
  o.chunkBytes = 1 << 20;
  Failures f;
  std::vector<uint64_t> sent(n, 0);
  std::string transport;
  runRanks(n, o, [&](int rank, gs_comm_t comm) {
    const auto chunksSent = [&] {
      gs_comm_stats_t st;
      memset(&st, 0, sizeof(st));
      st.struct_size = sizeof(st);
      if (gs_comm_stats(comm, &st) != GS_OK)
        return uint64_t{0};
      if (rank == 0)
        transport = st.transport;
      return st.chunks_sent;
    };
    for (bool inPlace : {false, true}) {
      std::vector<float> send(count), recv(count, -1.0f);
      for (size_t i = 0; i < count; ++i)
        send[i] = static_cast<float>(valueOf(rank, i));
      if (inPlace && rank == 0)
        recv = send;
      const uint64_t before = chunksSent();
      if (gs_reduce(inPlace && rank == 0 ? recv.data() : send.data(), recv.data(), count,
                    GS_FLOAT32, GS_SUM, 0, comm, nullptr) != GS_OK) {
        f.add(std::string("gs_reduce: ") + gs_last_error());
        return;
      }
      sent[rank] = std::max(sent[rank], chunksSent() - before);
      for (size_t i = 0; rank == 0 && i < count; ++i) {
        double want = 0;
        for (int q = 0; q < n; ++q)
          want += valueOf(q, i);
        if (recv[i] != static_cast<float>(want)) {
          f.add("element " + std::to_string(i) + (inPlace ? " in place" : ""));
          return;
        }
      }
    }
  });
  ASSERT_TRUE(f.list.empty()) << f.list.front();
  // Every sender sent the buffer once: 9 chunks of at most 128 KiB (5 of 256 KiB over tcp and
  // verbs), or fewer, larger ones (the communicator's chunk: over tcp 256 KiB too) where
  // crowded.
  const bool tcp = transport == "tcp" || transport == "verbs";
  const uint64_t pieces = tcp ? 5 : 9;
  const uint64_t most = *std::max_element(sent.begin(), sent.end());
  const std::string where = std::to_string(n) + " ranks on " + std::to_string(CPU_COUNT(&cpus)) +
                            " CPUs over " + transport + ", chunks sent " +
                            ::testing::PrintToString(sent);
  if (crowded)
    EXPECT_LT(most, tcp ? pieces + 1 : pieces) << where;
  else
    EXPECT_GE(most, pieces) << where;
}

TEST_P(RootedAllToAll, AllToAllEveryDtypeAndCountInAndOutOfPlace) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    for (gs_dtype_t t : kDtypes) {
      const size_t es = dtypeSize(t);
      for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{3001}}) {
        for (bool inPlace : {false, true}) {
          const size_t total = count * static_cast<size_t>(n);
          std::vector<uint8_t> send(total * es), recv(total * es, 0xcd);
          // Element t of block j, from rank r: a value naming all three.
          for (int j = 0; j < n; ++j) {
            for (size_t i = 0; i < count; ++i)
              storeElement(send.data(), t, j * count + i, valueOf(rank + 3 * j, i));
          }
          if (inPlace)
            recv = send;
          if (gs_alltoall(inPlace ? recv.data() : send.data(), recv.data(), count, t, comm,
                          nullptr) != GS_OK) {
            f.add(std::string("gs_alltoall: ") + gs_last_error());
            return;
          }
          for (int i = 0; i < n; ++i) {
            for (size_t k = 0; k < count; ++k) {
              if (loadElement(recv.data(), t, i * count + k) != valueOf(i + 3 * rank, k)) {
                f.add("rank " + std::to_string(rank) + " block " + std::to_string(i) + " element " +
                      std::to_string(k) + (inPlace ? " in place" : ""));
                return;
              }
            }
          }
        }
      }
    }
  });
  EXPECT_TRUE(f.list.empty()) << (f.list.empty() ? std::string() : f.list.front());
}

// Rank r sends counts[r][j] elements to rank j, blocks in a shuffled order with gaps.
struct Table {
  std::vector<std::vector<size_t>> sendCounts, sendDispls, recvCounts, recvDispls;
  size_t extent(const std::vector<size_t>& c, const std::vector<size_t>& d) const {
    size_t e = 0;
    for (size_t j = 0; j < c.size(); ++j)
      e = std::max(e, c[j] > 0 ? d[j] + c[j] : 0);
    return e;
  }
};

Table randomTable(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  Table t;
  std::vector<std::vector<size_t>> counts(n, std::vector<size_t>(n));
  for (auto& row : counts) {
    for (auto& c : row)
      c = rng() % 3 == 0 ? 0 : rng() % 2000;
  }
  auto place = [&](const std::vector<size_t>& sizes) {
    std::vector<int> order(n);
    for (int j = 0; j < n; ++j)
      order[j] = j;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<size_t> displs(n, 999999);  // empty blocks may name any displacement
    size_t at = 0;
    for (int j : order) {
      at += rng() % 3;
      if (sizes[j] > 0)
        displs[j] = at;
      at += sizes[j];
    }
    return displs;
  };
  for (int r = 0; r < n; ++r) {
    std::vector<size_t> in(n);
    for (int i = 0; i < n; ++i)
      in[i] = counts[i][r];
    t.sendCounts.push_back(counts[r]);
    t.recvCounts.push_back(in);
    t.sendDispls.push_back(place(counts[r]));
    t.recvDispls.push_back(place(in));
  }
  return t;
}

TEST_P(RootedAllToAll, AllToAllvUnevenBlocksEmptyPairsAndGapsBlockingAndNot) {
  const int n = nranks();
  Failures f;
  const Table table = randomTable(n, 11 + static_cast<uint32_t>(n));
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    for (bool blocking : {true, false}) {
      const size_t sendExtent = table.extent(table.sendCounts[rank], table.sendDispls[rank]);
      const size_t recvExtent = table.extent(table.recvCounts[rank], table.recvDispls[rank]);
      std::vector<float> send(sendExtent + 1), recv(recvExtent + 1, -1.f);
      for (int j = 0; j < n; ++j) {
        for (size_t k = 0; k < table.sendCounts[rank][j]; ++k)
          send[table.sendDispls[rank][j] + k] = static_cast<float>(rank * 100000 + j * 2000 + k);
      }
      gs_status_t st;
      if (blocking) {
        st = gs_alltoallv(send.data(), table.sendCounts[rank].data(), table.sendDispls[rank].data(),
                          recv.data(), table.recvCounts[rank].data(), table.recvDispls[rank].data(),
                          GS_FLOAT32, comm, nullptr);
      } else {
        gs_request_t req = nullptr;
        {
          // The arrays are copied by the call: they may go before the request completes.
          Table copy = table;
          st =
              gs_ialltoallv(send.data(), copy.sendCounts[rank].data(), copy.sendDispls[rank].data(),
                            recv.data(), copy.recvCounts[rank].data(), copy.recvDispls[rank].data(),
                            GS_FLOAT32, comm, nullptr, &req);
        }
        if (st == GS_OK)
          st = gs_wait(req, -1);
        gs_request_free(req);
      }
      if (st != GS_OK) {
        f.add(std::string("alltoallv: ") + gs_last_error());
        return;
      }
      std::vector<bool> inBlock(recv.size(), false);
      for (int i = 0; i < n; ++i) {
        for (size_t k = 0; k < table.recvCounts[rank][i]; ++k) {
          const size_t at = table.recvDispls[rank][i] + k;
          inBlock[at] = true;
          if (recv[at] != static_cast<float>(i * 100000 + rank * 2000 + k)) {
            f.add("rank " + std::to_string(rank) + " from " + std::to_string(i) + " element " +
                  std::to_string(k));
            return;
          }
        }
      }
      for (size_t at = 0; at < recv.size(); ++at) {
        if (!inBlock[at] && recv[at] != -1.f)
          f.add("rank " + std::to_string(rank) + " wrote the gap at " + std::to_string(at));
      }
    }
  });
  EXPECT_TRUE(f.list.empty()) << (f.list.empty() ? std::string() : f.list.front());
}

TEST_P(RootedAllToAll, NonBlockingReduceAndAllToAllCompleteInIssueOrder) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    const size_t count = 5000;
    std::vector<float> in(count * n), a2a(count * n), red(count, -1.f), ar(count);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = static_cast<float>(rank + i % 13);
    gs_request_t r[3] = {};
    bool ok =
        gs_ireduce(in.data(), red.data(), count, GS_FLOAT32, GS_MAX, 0, comm, nullptr, &r[0]) ==
            GS_OK &&
        gs_ialltoall(in.data(), a2a.data(), count, GS_FLOAT32, comm, nullptr, &r[1]) == GS_OK &&
        gs_iallreduce(in.data(), ar.data(), count, GS_FLOAT32, GS_SUM, comm, nullptr, &r[2]) ==
            GS_OK;
    // Issue order: once the last is done, so are the two before it.
    ok = ok && gs_wait(r[2], -1) == GS_OK;
    for (int k = 0; k < 2 && ok; ++k) {
      int done = 0;
      ok = gs_test(r[k], &done) == GS_OK;
      if (ok && !done)
        f.add("rank " + std::to_string(rank) + ": request " + std::to_string(k) +
              " still running after a later one completed");
    }
    if (!ok)
      f.add(std::string("request: ") + gs_last_error());
    for (auto* q : r)
      gs_request_free(q);
    if (!ok)
      return;
    for (size_t i = 0; i < count; ++i) {
      if (rank == 0 && red[i] != static_cast<float>(n - 1 + i % 13))
        f.add("ireduce MAX element " + std::to_string(i));
      for (int q = 0; q < n; ++q) {
        if (a2a[q * count + i] != static_cast<float>(q + (rank * count + i) % 13)) {
          f.add("ialltoall rank " + std::to_string(rank) + " block " + std::to_string(q));
          return;
        }
      }
    }
  });
  EXPECT_TRUE(f.list.empty()) << (f.list.empty() ? std::string() : f.list.front());
}

TEST_P(RootedAllToAll, BarrierReturnsOnlyOnceEveryRankHasCalledIt) {
  const int n = nranks();
  std::atomic<int> entered{0};
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    for (int round = 1; round <= 3; ++round) {
      // The last rank comes late every round; no rank may leave before it arrived.
      if (rank == n - 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      entered.fetch_add(1);
      if (gs_barrier(comm) != GS_OK) {
        f.add(std::string("gs_barrier: ") + gs_last_error());
        return;
      }
      if (entered.load() < round * n)
        f.add("rank " + std::to_string(rank) + " left barrier " + std::to_string(round) +
              " before every rank entered it");
      // Nobody enters the next round before everyone left this one's check.
      if (gs_barrier(comm) != GS_OK)
        f.add(std::string("gs_barrier: ") + gs_last_error());
    }
  });
  EXPECT_TRUE(f.list.empty()) << (f.list.empty() ? std::string() : f.list.front());
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         RootedAllToAll,
                         ::testing::Values(Param{"loopback", 1},
                                           Param{"loopback", 2},
                                           Param{"loopback", 3},
                                           Param{"loopback", 5},
                                           Param{"loopback", 9},
                                           Param{"tcp", 2},
                                           Param{"tcp", 4},
                                           Param{"shm", 2},
                                           Param{"shm", 3}),
                         transportRanksName);

TEST(RootedAllToAllErrors, APairThatDisagreesOnItsCountFailsNamingBothCounts) {
  const int n = 3;
  std::vector<std::string> errors(n);
  RankOptions o;
  o.timeoutMs = 3000;
  runRanks(n, o, [&](int rank, gs_comm_t comm) {
    std::vector<size_t> sc(n, 8), sd = {0, 8, 16}, rc(n, 8), rd = {0, 8, 16};
    if (rank == 2)
      sc[0] = 0;  // rank 0 expects 8 from rank 2
    std::vector<float> send(24), recv(24);
    if (gs_alltoallv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(),
                     GS_FLOAT32, comm, nullptr) != GS_OK)
      errors[rank] = gs_last_error();
  });
  EXPECT_NE(errors[0].find("all-to-all counts differ between ranks: rank 2 sends 0 elements to "
                           "rank 0, which expects 8 from it"),
            std::string::npos)
      << errors[0];
}

TEST(RootedAllToAllErrors, BadArgumentsNameTheArgument) {
  RankOptions o;
  runRanks(2, o, [&](int rank, gs_comm_t comm) {
    if (rank != 0)
      return;  // argument checks run before anything is sent: one rank is enough
    float buf[8] = {};
    EXPECT_EQ(gs_reduce(buf, buf, 4, GS_FLOAT32, GS_SUM, 2, comm, nullptr),
              GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("root 2 is out of range"), std::string::npos);
    EXPECT_EQ(gs_reduce(buf, nullptr, 4, GS_FLOAT32, GS_SUM, 0, comm, nullptr),
              GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("recvbuff is NULL on the root"), std::string::npos);
    EXPECT_EQ(gs_alltoall(buf, buf + 1, 2, GS_FLOAT32, comm, nullptr), GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("overlap"), std::string::npos);
    size_t counts[2] = {2, 2}, displs[2] = {0, 1};  // recv blocks of ranks 0 and 1 overlap
    size_t okDispls[2] = {0, 2};
    EXPECT_EQ(
        gs_alltoallv(buf, counts, okDispls, buf + 4, counts, displs, GS_FLOAT32, comm, nullptr),
        GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("recv blocks of ranks 0 and 1 overlap"),
              std::string::npos)
        << gs_last_error();
    EXPECT_EQ(
        gs_alltoallv(buf, nullptr, okDispls, buf + 4, counts, okDispls, GS_FLOAT32, comm, nullptr),
        GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("sendcounts or sdispls is NULL"),
              std::string::npos);
    size_t selfCounts[2] = {3, 2};
    EXPECT_EQ(gs_alltoallv(buf, selfCounts, okDispls, buf + 4, counts, okDispls, GS_FLOAT32, comm,
                           nullptr),
              GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("sendcounts[0] = 3 but recvcounts[0] = 2"),
              std::string::npos)
        << gs_last_error();
    EXPECT_EQ(gs_barrier(nullptr), GS_ERR_INVALID_ARGUMENT);
  });
}

}  // namespace
}  // namespace gs::testing
