// Rendezvous across two network namespaces joined by a veth pair: rank 0's server in one, a
// client in the other. Needs root and iproute2; skips otherwise. Traffic stays inside the two
// namespaces (198.18.0.0/24, the benchmarking range) and never reaches a real network.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/error.h"
#include "control/bootstrap.h"
#include "control/net.h"

namespace gs::control {
namespace {

bool sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Owns the two namespaces (and so the veth pair inside them); deletes them however the test
// ends.
class NetnsPair {
 public:
  NetnsPair() {
    std::string suffix = std::to_string(getpid());
    a_ = "gs-rdv-a-" + suffix;
    b_ = "gs-rdv-b-" + suffix;
    vethA_ = "gsva" + suffix;
    vethB_ = "gsvb" + suffix;
  }
  ~NetnsPair() {
    sh("ip netns del " + a_);
    sh("ip netns del " + b_);
  }

  // Returns an empty string on success, else what failed.
  std::string create() {
    if (!sh("ip netns add " + a_))
      return "ip netns add failed";
    if (!sh("ip netns add " + b_))
      return "ip netns add failed";
    const std::string steps[] = {
        "ip link add " + vethA_ + " netns " + a_ + " type veth peer name " + vethB_ + " netns " +
            b_,
        "ip -n " + a_ + " addr add 198.18.0.1/24 dev " + vethA_,
        "ip -n " + b_ + " addr add 198.18.0.2/24 dev " + vethB_,
        "ip -n " + a_ + " link set " + vethA_ + " up",
        "ip -n " + b_ + " link set " + vethB_ + " up",
        "ip -n " + a_ + " link set lo up",
        "ip -n " + b_ + " link set lo up",
    };
    for (const auto& step : steps) {
      if (!sh(step))
        return "'" + step + "' failed";
    }
    return "";
  }

  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& vethA() const { return vethA_; }

 private:
  std::string a_, b_, vethA_, vethB_;
};

// Moves the calling thread (only) into a named network namespace; sockets it creates live there.
void enterNetns(const std::string& name) {
  int fd = open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  GS_CHECK(fd >= 0, Errc::kSystem, "cannot open netns %s", name.c_str());
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  GS_CHECK(rc == 0, Errc::kSystem, "setns(%s) failed", name.c_str());
}

TEST(NetnsRendezvous, ClientInAnotherNamespaceReportsItsOwnAddress) {
  if (geteuid() != 0)
    GTEST_SKIP() << "needs root to create network namespaces";
  if (!sh("ip -V"))
    GTEST_SKIP() << "iproute2 ('ip') is not installed";
  NetnsPair netns;
  std::string failure = netns.create();
  if (!failure.empty())
    GTEST_SKIP() << "cannot set up network namespaces: " << failure;

  Config config;
  config.timeoutMs = 5000;
  config.socketIfname = netns.vethA();
  UniqueId id;
  std::string serverError;
  // Rank 0's process side, in namespace A: gs_get_unique_id with GS_SOCKET_IFNAME set.
  std::thread([&] {
    try {
      enterNetns(netns.a());
      id = createUniqueId(config);
    } catch (const Error& e) {
      serverError = e.what();
    }
  }).join();
  ASSERT_EQ(serverError, "");
  EXPECT_EQ(id.address.toString(), "198.18.0.1");

  auto deadline = Deadline::afterMs(5000);
  std::string localA, localB, errorA, errorB;
  std::vector<std::vector<uint8_t>> allB;
  auto rank = [&](const std::string& ns, int r, std::string& local, std::string& error,
                  std::vector<std::vector<uint8_t>>* all) {
    try {
      enterNetns(ns);
      auto client = BootstrapClient::connect(UniqueId::parse(id.serialize()), r, 2, deadline);
      local = client.localAddress();
      std::vector<uint8_t> payload(local.begin(), local.end());
      auto gathered = client.allgather(payload, deadline);
      if (all)
        *all = gathered;
    } catch (const Error& e) {
      error = e.what();
    }
  };
  std::thread rank0(rank, netns.a(), 0, std::ref(localA), std::ref(errorA), nullptr);
  std::thread rank1(rank, netns.b(), 1, std::ref(localB), std::ref(errorB), &allB);
  rank0.join();
  rank1.join();
  shutdownRendezvousServers();
  ASSERT_EQ(errorA, "");
  ASSERT_EQ(errorB, "");
  EXPECT_EQ(localA, "198.18.0.1");
  EXPECT_EQ(localB, "198.18.0.2");
  ASSERT_EQ(allB.size(), 2u);
  EXPECT_EQ(std::string(allB[0].begin(), allB[0].end()), "198.18.0.1");
  EXPECT_EQ(std::string(allB[1].begin(), allB[1].end()), "198.18.0.2");
}

}  // namespace
}  // namespace gs::control
