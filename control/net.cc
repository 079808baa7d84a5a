#include "control/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "common/error.h"

namespace gs::control {

std::optional<IpAddress> IpAddress::tryParse(const std::string& text) {
  std::string s = text;
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']')
    s = s.substr(1, s.size() - 2);
  IpAddress out;
  if (inet_pton(AF_INET, s.c_str(), out.bytes.data()) == 1) {
    out.family = Family::kV4;
    return out;
  }
  if (inet_pton(AF_INET6, s.c_str(), out.bytes.data()) == 1) {
    out.family = Family::kV6;
    return out;
  }
  return std::nullopt;
}

IpAddress IpAddress::parse(const std::string& text, const char* what) {
  auto parsed = tryParse(text);
  GS_CHECK(parsed.has_value(), Errc::kInvalidArgument, "%s: '%s' is not an IP address", what,
           text.c_str());
  return *parsed;
}

std::string IpAddress::toString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  int af = family == Family::kV4 ? AF_INET : AF_INET6;
  if (inet_ntop(af, bytes.data(), buf, sizeof(buf)) == nullptr)
    return "<invalid address>";
  return buf;
}

bool IpAddress::isLoopback() const {
  if (family == Family::kV4)
    return bytes[0] == 127;
  static const std::array<uint8_t, 16> kV6Loopback{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return bytes == kV6Loopback;
}

bool IpAddress::isUnspecified() const {
  for (uint8_t b : bytes) {
    if (b != 0)
      return false;
  }
  return true;
}

uint16_t parsePort(const std::string& text, const char* what) {
  bool digits = !text.empty() && text.size() <= 5;
  for (char c : text)
    digits = digits && c >= '0' && c <= '9';
  long value = digits ? std::stol(text) : 0;
  GS_CHECK(digits && value >= 1 && value <= 65535, Errc::kInvalidArgument,
           "%s: '%s' is not a port number (1..65535)", what, text.c_str());
  return static_cast<uint16_t>(value);
}

HostPort parseHostPort(const std::string& text, const char* what) {
  HostPort out;
  std::string portText;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    GS_CHECK(close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':',
             Errc::kInvalidArgument, "%s: '%s' is not of the form [ipv6]:port", what, text.c_str());
    out.host = text.substr(1, close - 1);
    portText = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    GS_CHECK(colon != std::string::npos && colon > 0, Errc::kInvalidArgument,
             "%s: '%s' is not of the form host:port", what, text.c_str());
    out.host = text.substr(0, colon);
    // A second colon means an unbracketed IPv6 literal, where the port is ambiguous.
    GS_CHECK(out.host.find(':') == std::string::npos, Errc::kInvalidArgument,
             "%s: '%s': write an IPv6 address in brackets, as [addr]:port", what, text.c_str());
    portText = text.substr(colon + 1);
  }
  GS_CHECK(!out.host.empty(), Errc::kInvalidArgument, "%s: '%s' has an empty host", what,
           text.c_str());
  out.port = parsePort(portText, what);
  return out;
}

std::string formatEndpoint(const IpAddress& address, uint16_t port) {
  if (address.family == IpAddress::Family::kV6) {
    return "[" + address.toString() + "]:" + std::to_string(port);
  }
  return address.toString() + ":" + std::to_string(port);
}

IpAddress resolveHost(const std::string& host, const char* what) {
  if (auto numeric = IpAddress::tryParse(host))
    return *numeric;
  namespace ip = boost::asio::ip;
  boost::asio::io_context io;
  ip::tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto results = resolver.resolve(host, "", ec);
  GS_CHECK(!ec, Errc::kInvalidArgument, "cannot resolve host '%s' (%s): %s", host.c_str(), what,
           ec.message().c_str());
  std::optional<IpAddress> v6;
  for (const auto& entry : results) {
    ip::address a = entry.endpoint().address();
    IpAddress out;
    if (a.is_v4()) {
      auto b = a.to_v4().to_bytes();
      std::copy(b.begin(), b.end(), out.bytes.begin());
      return out;  // IPv4 first: it is what every rank most likely reaches too.
    }
    if (!v6) {
      auto b = a.to_v6().to_bytes();
      out.family = IpAddress::Family::kV6;
      std::copy(b.begin(), b.end(), out.bytes.begin());
      v6 = out;
    }
  }
  GS_CHECK(v6.has_value(), Errc::kInvalidArgument, "cannot resolve host '%s' (%s): no address",
           host.c_str(), what);
  return *v6;
}

std::string interfaceAddress(const std::string& ifname) {
  ifaddrs* list = nullptr;
  GS_CHECK_ERRNO(getifaddrs(&list));
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(list, freeifaddrs);
  std::optional<IpAddress> v4, v6;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || ifname != it->ifa_name)
      continue;
    IpAddress a;
    if (it->ifa_addr->sa_family == AF_INET && !v4) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
      memcpy(a.bytes.data(), &sin->sin_addr, 4);
      v4 = a;
    } else if (it->ifa_addr->sa_family == AF_INET6 && !v6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(it->ifa_addr);
      // Link-local addresses need a scope id that means nothing on the other hosts, so they
      // cannot go into a unique id.
      if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr))
        continue;
      a.family = IpAddress::Family::kV6;
      memcpy(a.bytes.data(), &sin6->sin6_addr, 16);
      v6 = a;
    }
  }
  GS_CHECK(v4 || v6, Errc::kInvalidArgument,
           "GS_SOCKET_IFNAME=%s: no such interface or it has no address", ifname.c_str());
  return v4 ? v4->toString() : v6->toString();
}

}  // namespace gs::control
