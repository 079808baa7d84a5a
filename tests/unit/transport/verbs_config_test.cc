// Verbs configuration parsing: runs on every host (no RDMA device needed).
#include <cerrno>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "transport/verbs/handles.h"
#include "transport/verbs/port_select.h"

namespace gs::transport::verbs {
namespace {

// ibv_destroy_* / ibv_dealloc_pd / ibv_dereg_mr return the error number; the teardown report
// must name the call and that reason (not whatever errno holds), and say nothing on success.
TEST(VerbsTeardown, ReportsTheReturnedErrorNotErrno) {
  ::testing::internal::CaptureStderr();
  errno = ENOENT;
  reportTeardown(EBUSY, "ibv_dealloc_pd");
  reportTeardown(0, "ibv_destroy_qp");
  errno = EINVAL;
  reportTeardown(-1, "ibv_destroy_cq");  // a provider returning -1 leaves the reason in errno
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("verbs: ibv_dealloc_pd failed: Device or resource busy"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("No such file"), std::string::npos) << out;
  EXPECT_EQ(out.find("ibv_destroy_qp"), std::string::npos) << out;
  EXPECT_NE(out.find("verbs: ibv_destroy_cq failed: Invalid argument"), std::string::npos) << out;
}

TEST(VerbsHcaList, ParsesNamesPortsAndWhitespace) {
  auto list = parseHcaList(" mlx5_0:1, mlx5_1 ,rxe0:2");
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].device, "mlx5_0");
  EXPECT_EQ(list[0].port, 1);
  EXPECT_EQ(list[1].device, "mlx5_1");
  EXPECT_EQ(list[1].port, 0);
  EXPECT_EQ(list[2].device, "rxe0");
  EXPECT_EQ(list[2].port, 2);
  EXPECT_TRUE(parseHcaList("").empty());
  EXPECT_TRUE(parseHcaList(" , ").empty());
}

TEST(VerbsHcaList, RejectsMalformedEntriesNamingThem) {
  for (const char* bad : {"mlx5_0:", "mlx5_0:x", "mlx5_0:0", "mlx5_0:256", ":1"}) {
    try {
      parseHcaList(std::string("ok,") + bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("GS_IB_HCA"), std::string::npos) << e.what();
    }
  }
}

TEST(VerbsGid, PrintsIpv4MappedAndLinkLocal) {
  ibv_gid gid{};
  gid.raw[10] = gid.raw[11] = 0xff;
  gid.raw[12] = 10;
  gid.raw[13] = 77;
  gid.raw[15] = 1;
  EXPECT_EQ(gidText(gid), "::ffff:10.77.0.1");
  ibv_gid local{};
  local.raw[0] = 0xfe;
  local.raw[1] = 0x80;
  local.raw[15] = 2;
  EXPECT_EQ(gidText(local), "fe80::2");
}

}  // namespace
}  // namespace gs::transport::verbs
