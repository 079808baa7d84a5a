// gs_comm_register / gs_comm_deregister: N ranks as threads over loopback, tcp and shm (and over
// verbs in the VM: rdma.capi_parity, where registrations pin pages). Collectives on registered
// buffers stay exact; their registrations are made once and kept (the count in gs_comm_stats
// stops growing); deregistering drops the plans that held them (the next call registers
// again); bad handles and arguments are clear errors.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gradstream/gradstream.h"
#include "unit/capi/rank_threads.h"

namespace gs::testing {
namespace {

uint64_t registrations(gs_comm_t comm) {
  gs_comm_stats_t st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  return gs_comm_stats(comm, &st) == GS_OK ? st.buffer_registrations : ~uint64_t{0};
}

// Registers a send and a receive buffer; false (a failure added) when either is refused.
bool registerBoth(gs_comm_t comm,
                  std::vector<float>& send,
                  std::vector<float>& recv,
                  void** hs,
                  void** hr,
                  Failures& f,
                  const std::string& me) {
  if (gs_comm_register(comm, send.data(), send.size() * 4, hs) == GS_OK &&
      gs_comm_register(comm, recv.data(), recv.size() * 4, hr) == GS_OK)
    return true;
  f.add(me + "register: " + gs_last_error());
  return false;
}

class Registration : public TransportRanksTest {};

TEST_P(Registration, RegisteredBuffersKeepTheirRegistrationsUntilDeregistered) {
  const int n = nranks();
  Failures f;
  runRanks(n, options(), [&](int rank, gs_comm_t comm) {
    const std::string me = "rank " + std::to_string(rank) + ": ";
    constexpr size_t kCount = 70000;  // several chunks
    std::vector<float> send(kCount), recv(kCount);
    void* hs = nullptr;
    void* hr = nullptr;
    if (!registerBoth(comm, send, recv, &hs, &hr, f, me))
      return;
    auto allreduce = [&](int round) {
      for (size_t i = 0; i < kCount; ++i)
        send[i] = static_cast<float>((i + static_cast<size_t>(rank) + round) % 7);
      if (gs_allreduce(send.data(), recv.data(), kCount, GS_FLOAT32, GS_SUM, comm, nullptr) !=
          GS_OK) {
        f.add(me + "allreduce: " + gs_last_error());
        return;
      }
      for (size_t i = 0; i < kCount; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r)
          want += static_cast<float>((i + static_cast<size_t>(r) + round) % 7);
        if (recv[i] != want) {
          f.add(me + "element " + std::to_string(i) + " is " + std::to_string(recv[i]));
          return;
        }
      }
    };
    allreduce(0);
    const uint64_t once = registrations(comm);
    for (int round = 1; round < 6; ++round)
      allreduce(round);
    if (registrations(comm) != once)
      f.add(me + "registered again on later calls: " + std::to_string(once) + " -> " +
            std::to_string(registrations(comm)));
    // Dropping the receive buffer's registration drops the plan that held it: the next call
    // registers anew (and stays exact).
    if (gs_comm_deregister(comm, hr) != GS_OK)
      f.add(me + "deregister: " + gs_last_error());
    allreduce(6);
    if (n > 1 && registrations(comm) <= once)
      f.add(me + "no new registration after deregistering");
    if (gs_comm_deregister(comm, hr) != GS_ERR_INVALID_ARGUMENT)
      f.add(me + "a second deregister of one handle was accepted");
    if (gs_comm_deregister(comm, hs) != GS_OK)
      f.add(me + "deregister send: " + gs_last_error());
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

// GS_ALGO_TUNE's first calls of a size run a different schedule each (a plan each): the plans
// share the registrations of the one pair of buffers instead of each registering them again.
TEST(RegistrationWhileTuning, TheScheduleTrialsShareOneRegistrationOfEachBuffer) {
  ScopedEnv tune("GS_ALGO_TUNE", "always");
  constexpr int kRanks = 4;
  constexpr size_t kCount = 64 * 1024;  // 256 KiB: tuned, with several close schedules at N=4
  Failures f;
  runRanks(kRanks, RankOptions{}, [&](int rank, gs_comm_t comm) {
    const std::string me = "rank " + std::to_string(rank) + ": ";
    std::vector<float> send(kCount, 1.0f), recv(kCount);
    void* hs = nullptr;
    void* hr = nullptr;
    if (!registerBoth(comm, send, recv, &hs, &hr, f, me))
      return;
    uint64_t first = 0;
    std::vector<std::string> schedules;
    for (int call = 0; call < 12; ++call) {
      if (gs_allreduce(send.data(), recv.data(), kCount, GS_FLOAT32, GS_SUM, comm, nullptr) !=
          GS_OK) {
        f.add(me + "allreduce: " + gs_last_error());
        return;
      }
      if (recv[kCount - 1] != static_cast<float>(kRanks)) {
        f.add(me + "call " + std::to_string(call) + " gave " + std::to_string(recv[kCount - 1]));
        return;
      }
      gs_comm_stats_t st;
      memset(&st, 0, sizeof(st));
      st.struct_size = sizeof(st);
      gs_comm_stats(comm, &st);
      if (std::find(schedules.begin(), schedules.end(), st.last_algorithm) == schedules.end())
        schedules.emplace_back(st.last_algorithm);
      if (call == 0)
        first = st.buffer_registrations;
      else if (st.buffer_registrations != first)
        f.add(me + "call " + std::to_string(call) + " (" + st.last_algorithm +
              ") registered again: " + std::to_string(first) + " -> " +
              std::to_string(st.buffer_registrations));
    }
    if (schedules.size() < 2)
      f.add(me + "the trials ran only " + schedules.front() + ": nothing shared was tested");
    gs_comm_deregister(comm, hr);
    gs_comm_deregister(comm, hs);
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

INSTANTIATE_TEST_SUITE_P(
    Transports,
    Registration,
    ::testing::Values(Param{"loopback", 1}, Param{"loopback", 3}, Param{"tcp", 2}, Param{"shm", 2}),
    transportRanksName);

TEST(RegistrationErrors, BadArgumentsAndHandlesAreNamed) {
  RankOptions opt;
  Failures f;
  runRanks(1, opt, [&](int, gs_comm_t comm) {
    std::vector<uint8_t> buf(256);
    void* h = nullptr;
    auto expect = [&](gs_status_t got, const char* what, const char* words) {
      const std::string msg = gs_last_error();
      if (got != GS_ERR_INVALID_ARGUMENT || msg.find(words) == std::string::npos)
        f.add(std::string(what) + ": status " + std::to_string(got) + ", \"" + msg + "\"");
    };
    expect(gs_comm_register(nullptr, buf.data(), 256, &h), "NULL comm", "comm");
    expect(gs_comm_register(comm, nullptr, 256, &h), "NULL buff", "buff is NULL");
    expect(gs_comm_register(comm, buf.data(), 0, &h), "size 0", "size is 0");
    expect(gs_comm_register(comm, buf.data(), 256, nullptr), "NULL out", "out_handle is NULL");
    if (gs_comm_register(comm, buf.data(), 256, &h) != GS_OK)
      f.add(std::string("register: ") + gs_last_error());
    expect(gs_comm_register(comm, buf.data(), 128, &h), "twice", "registered already");
    int other = 0;
    expect(gs_comm_deregister(comm, &other), "foreign handle", "no registration");
    expect(gs_comm_deregister(comm, nullptr), "NULL handle", "handle is NULL");
    if (gs_comm_deregister(comm, buf.data()) != GS_OK)
      f.add(std::string("deregister: ") + gs_last_error());
  });
  EXPECT_TRUE(f.list.empty()) << ::testing::PrintToString(f.list);
}

}  // namespace
}  // namespace gs::testing
