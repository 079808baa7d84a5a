// gs_comm_split: N ranks as threads over loopback, tcp and shm split by color into halves and
// odd groups, ordered by key; split of a split; collectives on parent and child alternately;
// GS_SPLIT_NOCOLOR; a bad color reported by every rank.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

// Sum over the communicator of every member's `value` (an allreduce of one int64).
bool sumOf(gs_comm_t comm, int64_t value, int64_t* out) {
  return gs_allreduce(&value, out, 1, GS_INT64, GS_SUM, comm, nullptr) == GS_OK;
}

class CommSplit : public TransportRanksTest {};

TEST_P(CommSplit, ColorsFormGroupsRankedByKeyAndBothCommunicatorsKeepWorking) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t parent) {
    // Even and odd parent ranks; key = -rank, so the highest parent rank is rank 0 of its group.
    gs_comm_t child = nullptr;
    if (gs_comm_split(parent, rank % 2, -rank, nullptr, &child) != GS_OK || child == nullptr) {
      f.add("rank " + std::to_string(rank) + ": split: " + gs_last_error());
      return;
    }
    int crank = -1, csize = -1;
    gs_comm_rank(child, &crank);
    gs_comm_size(child, &csize);
    std::vector<int> group;
    for (int r = n - 1; r >= 0; --r) {
      if (r % 2 == rank % 2)
        group.push_back(r);
    }
    if (csize != static_cast<int>(group.size()) || group[crank] != rank)
      f.add("rank " + std::to_string(rank) + ": child rank " + std::to_string(crank) + " of " +
            std::to_string(csize));
    int64_t groupSum = 0;
    for (int r : group)
      groupSum += r + 1;
    const int64_t all = static_cast<int64_t>(n) * (n + 1) / 2;
    // Alternately on parent and child: each sees only its own members.
    for (int round = 0; round < 3; ++round) {
      int64_t p = 0, c = 0;
      if (!sumOf(parent, rank + 1, &p) || !sumOf(child, rank + 1, &c)) {
        f.add(std::string("collective: ") + gs_last_error());
        break;
      }
      if (p != all || c != groupSum)
        f.add("rank " + std::to_string(rank) + ": sums " + std::to_string(p) + " / " +
              std::to_string(c));
    }
    // Split of the split: the child's first member alone, the rest together (odd groups).
    gs_comm_t grandchild = nullptr;
    const int color = crank == 0 ? 0 : 1;
    if (gs_comm_split(child, color, crank, nullptr, &grandchild) != GS_OK || !grandchild) {
      f.add(std::string("split of a split: ") + gs_last_error());
    } else {
      int gsize = 0;
      gs_comm_size(grandchild, &gsize);
      int64_t s = 0;
      if (gsize != (crank == 0 ? 1 : csize - 1) || !sumOf(grandchild, 1, &s) || s != gsize)
        f.add("rank " + std::to_string(rank) + ": grandchild of " + std::to_string(gsize));
      gs_comm_destroy(grandchild);
    }
    gs_comm_destroy(child);
    int64_t p = 0;
    if (!sumOf(parent, 1, &p) || p != n)  // the parent outlives its children
      f.add(std::string("parent after the children: ") + gs_last_error());
  });
  EXPECT_TRUE(f.list.empty()) << (f.list.empty() ? "" : f.list.front());
}

TEST_P(CommSplit, NoColorGivesNullAndTheOthersGoOn) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t parent) {
    gs_comm_t child = reinterpret_cast<gs_comm_t>(&f);  // must be overwritten
    const int color = rank == 0 ? GS_SPLIT_NOCOLOR : 7;
    if (gs_comm_split(parent, color, 0, nullptr, &child) != GS_OK) {
      f.add(std::string("split: ") + gs_last_error());
      return;
    }
    if (rank == 0) {
      if (child != nullptr)
        f.add("GS_SPLIT_NOCOLOR did not give NULL");
      return;
    }
    int64_t s = 0;
    if (child == nullptr || !sumOf(child, 1, &s) || s != n - 1)
      f.add("rank " + std::to_string(rank) + ": the others' communicator");
    gs_comm_destroy(child);
  });
  EXPECT_TRUE(f.list.empty()) << (f.list.empty() ? "" : f.list.front());
}

INSTANTIATE_TEST_SUITE_P(
    Transports,
    CommSplit,
    ::testing::Values(Param{"loopback", 1}, Param{"loopback", 5}, Param{"tcp", 4}, Param{"shm", 3}),
    [](const ::testing::TestParamInfo<Param>& p) {
      return std::string(std::get<0>(p.param)) + "_" + std::to_string(std::get<1>(p.param)) +
             "ranks";
    });

TEST(CommSplitErrors, ABadColorFailsOnEveryRankNamingIt) {
  const int n = 3;
  std::vector<std::string> errors(n);
  std::vector<gs_status_t> status(n);
  runRanks(n, RankOptions{}, [&](int rank, gs_comm_t parent) {
    gs_comm_t child = nullptr;
    status[rank] = gs_comm_split(parent, rank == 1 ? -5 : 0, 0, nullptr, &child);
    errors[rank] = gs_last_error();
    if (child != nullptr)
      gs_comm_destroy(child);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r], GS_ERR_INVALID_ARGUMENT) << "rank " << r;
    EXPECT_NE(errors[r].find("rank 1 passed color -5"), std::string::npos) << errors[r];
  }
}

// Bytes of this process's shared-memory files (the shm transport's devices, connections and
// receive slots are files "gs-<pid>-..." in /dev/shm).
int64_t sharedMemoryBytesOfThisProcess() {
  const std::string prefix = "gs-" + std::to_string(getpid()) + "-";
  int64_t bytes = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr)
    return -1;
  while (const dirent* e = readdir(dir)) {
    struct stat st {};
    const std::string path = std::string("/dev/shm/") + e->d_name;
    if (std::string(e->d_name).rfind(prefix, 0) == 0 && stat(path.c_str(), &st) == 0)
      bytes += st.st_size;
  }
  closedir(dir);
  return bytes;
}

// A child makes each link when a call first needs it: after the split its members hold no
// receive slots (a group nobody calls on costs no shared memory); its first allreduce makes
// them. Four ranks as threads of this process, two groups of two (runRanks fails a rank whose
// links are not over shm).
TEST(CommSplitLinks, AChildHoldsNoSlotsBeforeItsFirstCallOverShm) {
  const int n = 4;
  const int64_t slotBytes = 8 * (1 << 20);  // the defaults: 8 slots of 1 MiB per link
  int64_t before = -1, afterSplit = -1, afterCall = -1;
  std::vector<std::string> errors(n);
  RankOptions o;
  o.transport = "shm";
  runRanks(n, o, [&](int rank, gs_comm_t parent) {
    int64_t ignored = 0;
    // Rank 0 measures while the others wait in the parent's next allreduce.
    if (rank == 0)
      before = sharedMemoryBytesOfThisProcess();
    sumOf(parent, 1, &ignored);
    gs_comm_t child = nullptr;
    if (gs_comm_split(parent, rank % 2, rank, nullptr, &child) != GS_OK) {
      errors[rank] = std::string("split: ") + gs_last_error();
      return;
    }
    sumOf(parent, 1, &ignored);
    if (rank == 0)
      afterSplit = sharedMemoryBytesOfThisProcess();
    sumOf(parent, 1, &ignored);
    int64_t sum = 0;
    if (!sumOf(child, 1 << 20, &sum) || sum != 2 << 20)
      errors[rank] = std::string("child allreduce: ") + gs_last_error();
    sumOf(parent, 1, &ignored);
    if (rank == 0)
      afterCall = sharedMemoryBytesOfThisProcess();
    sumOf(parent, 1, &ignored);
    gs_comm_destroy(child);
    // A child nobody calls on is destroyed without ever linking, and the parent goes on.
    gs_comm_t unused = nullptr;
    if (gs_comm_split(parent, 0, rank, nullptr, &unused) != GS_OK || unused == nullptr)
      errors[rank] = std::string("second split: ") + gs_last_error();
    gs_comm_destroy(unused);
    if (!sumOf(parent, 1, &ignored) || ignored != n)
      errors[rank] = std::string("parent after an unused child: ") + gs_last_error();
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(errors[r], "") << "rank " << r;
  ASSERT_GE(before, 0) << "no /dev/shm";
  // The split adds each member's shm device (a small control block), no connection or slots.
  EXPECT_LT(afterSplit - before, slotBytes / 8) << before << " -> " << afterSplit;
  // The first call links each member to its one peer: a connection with slots per member.
  EXPECT_GE(afterCall - afterSplit, 4 * slotBytes) << afterSplit << " -> " << afterCall;
}

// The members' records travel over the parent: a setting the members disagree on fails every
// member naming both ranks, a member whose settings are refused (or that cannot open its
// devices) fails the others naming it, and the parent goes on working either way. (Settings the
// rdma VM's environment overrides, such as the transport, would not fail there.)
TEST(CommSplitErrors, MembersThatCannotJoinFailTheirGroupNamingThemAndTheParentGoesOn) {
  const int n = 4;
  std::vector<std::string> errors(n), parentAfter(n);
  std::vector<gs_status_t> status(n);
  runRanks(n, RankOptions{"tcp"}, [&](int rank, gs_comm_t parent) {
    gs_config_t cfg;
    gs_config_init(&cfg);
    if (rank == 1)
      cfg.chunk_bytes = 64 << 10;  // color 0 (ranks 0, 1) disagrees on the chunk size
    if (rank == 3)
      cfg.slots_per_peer = 1;  // color 1 (ranks 2, 3): rank 3's settings are refused
    gs_comm_t child = nullptr;
    status[rank] = gs_comm_split(parent, rank / 2, 0, &cfg, &child);
    errors[rank] = gs_last_error();
    if (child != nullptr)
      gs_comm_destroy(child);
    int64_t sum = 0;
    if (!sumOf(parent, 1, &sum) || sum != n)
      parentAfter[rank] = std::string("parent after the failed split: ") + gs_last_error();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(status[r], GS_OK) << "rank " << r;
    EXPECT_EQ(parentAfter[r], "") << "rank " << r;
  }
  for (int r : {0, 1}) {
    EXPECT_EQ(status[r], GS_ERR_INVALID_ARGUMENT) << errors[r];
    EXPECT_NE(errors[r].find("chunk_bytes"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("the new ranks 0..1 are ranks 0, 1 of the communicator split"),
              std::string::npos)
        << errors[r];
  }
  EXPECT_NE(errors[2].find("rank 3 could not join the new communicator"), std::string::npos)
      << errors[2];
  EXPECT_NE(errors[3].find("slots_per_peer 1"), std::string::npos) << errors[3];
}

TEST(CommSplitErrors, NullArguments) {
  gs_comm_t out = nullptr;
  EXPECT_EQ(gs_comm_split(nullptr, 0, 0, nullptr, &out), GS_ERR_INVALID_ARGUMENT);
  runRanks(1, RankOptions{}, [&](int, gs_comm_t parent) {
    EXPECT_EQ(gs_comm_split(parent, 0, 0, nullptr, nullptr), GS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(gs_last_error()).find("out_comm is NULL"), std::string::npos);
  });
}

}  // namespace
}  // namespace gs::testing
