#include "control/net.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace gs::control {
namespace {

TEST(IpAddress, ParsesAndFormatsBothFamilies) {
  IpAddress v4 = IpAddress::parse("10.1.2.3");
  EXPECT_EQ(v4.family, IpAddress::Family::kV4);
  EXPECT_EQ(v4.toString(), "10.1.2.3");
  EXPECT_FALSE(v4.isLoopback());
  EXPECT_TRUE(IpAddress::parse("127.0.0.1").isLoopback());

  IpAddress v6 = IpAddress::parse("[::1]");
  EXPECT_EQ(v6.family, IpAddress::Family::kV6);
  EXPECT_TRUE(v6.isLoopback());
  EXPECT_EQ(formatEndpoint(v6, 80), "[::1]:80");
  EXPECT_EQ(formatEndpoint(v4, 29500), "10.1.2.3:29500");
  EXPECT_TRUE(IpAddress::parse("0.0.0.0").isUnspecified());

  EXPECT_FALSE(IpAddress::tryParse("example.com").has_value());
  EXPECT_FALSE(IpAddress::tryParse("1.2.3.256").has_value());
  try {
    IpAddress::parse("nope", "MASTER_ADDR");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR: 'nope'"), std::string::npos) << e.what();
  }
}

TEST(HostPort, ParsesNamesV4AndBracketedV6) {
  HostPort a = parseHostPort("node-1:29500", "GS_TEST");
  EXPECT_EQ(a.host, "node-1");
  EXPECT_EQ(a.port, 29500);
  HostPort b = parseHostPort("[fe80::2]:1", "GS_TEST");
  EXPECT_EQ(b.host, "fe80::2");
  EXPECT_EQ(b.port, 1);
  for (const char* bad : {"", "host", "host:", ":80", "host:0", "host:65536", "host:8x", "::1:80",
                          "[::1]80", "[::1]", "host:-1"}) {
    EXPECT_THROW(parseHostPort(bad, "GS_TEST"), Error) << bad;
  }
  EXPECT_EQ(parsePort("65535", "p"), 65535);
}

TEST(ResolveHost, NumericAndLocalhost) {
  EXPECT_EQ(resolveHost("192.0.2.7", "test").toString(), "192.0.2.7");
  IpAddress local = resolveHost("localhost", "test");
  EXPECT_TRUE(local.isLoopback()) << local.toString();
  EXPECT_THROW(resolveHost("no-such-host.invalid", "test"), Error);
}

TEST(InterfaceAddress, LoopbackAndMissingInterface) {
  EXPECT_EQ(interfaceAddress("lo"), "127.0.0.1");
  try {
    interfaceAddress("gs-no-such-if");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "GS_SOCKET_IFNAME=gs-no-such-if: no such interface or it has no address");
  }
}

}  // namespace
}  // namespace gs::control
