// PortCounters reads sysfs hw_counters. The real files exist only with an RDMA device (the VM
// test checks rxe's); here a fake sysfs tree in a temporary directory stands in for them.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "transport/verbs/hw_counters.h"

namespace gs::transport::verbs {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gs-sysfs.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    dir_ = root_ + "/class/infiniband/mlx5_0/ports/1/hw_counters";
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const char* name, const char* value) { std::ofstream(dir_ + "/" + name) << value; }
  std::string root_, dir_;
};

TEST_F(FakeSysfs, SumsRetransmissionCountersAndReadsEcnAndCnp) {
  write("np_ecn_marked_roce_packets", "12\n");
  write("rp_cnp_handled", "7\n");
  write("local_ack_timeout_err", "3\n");
  write("packet_seq_err", "4\n");
  PortCounters counters("mlx5_0", 1, root_, std::chrono::milliseconds(0));
  LinkInfo info;
  ASSERT_TRUE(counters.read(&info));
  EXPECT_EQ(info.ecnMarked, 12u);
  EXPECT_EQ(info.cnpReceived, 7u);
  EXPECT_EQ(info.retransmits, 7u);
}

TEST_F(FakeSysfs, CachesWithinTheRefreshInterval) {
  write("rp_cnp_handled", "1");
  PortCounters counters("mlx5_0", 1, root_, std::chrono::hours(1));
  LinkInfo info;
  ASSERT_TRUE(counters.read(&info));
  write("rp_cnp_handled", "99");
  ASSERT_TRUE(counters.read(&info));
  EXPECT_EQ(info.cnpReceived, 1u);
  PortCounters fresh("mlx5_0", 1, root_, std::chrono::milliseconds(0));
  ASSERT_TRUE(fresh.read(&info));
  EXPECT_EQ(info.cnpReceived, 99u);
}

TEST_F(FakeSysfs, PortWithoutCountersYieldsNothing) {
  write("unrelated_counter", "5");
  PortCounters counters("mlx5_0", 1, root_);
  LinkInfo info;
  EXPECT_FALSE(counters.read(&info));
  PortCounters missing("mlx5_9", 2, root_);
  EXPECT_FALSE(missing.read(&info));
}

}  // namespace
}  // namespace gs::transport::verbs
