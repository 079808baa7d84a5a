#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

// Small address helpers for the control plane (rendezvous, launch environment). They keep
// Boost.Asio out of control/'s headers: callers pass strings and IpAddress values around, and
// only the .cc files turn them into sockets. All functions are thread-safe (no shared state).

namespace gs::control {

/// An IPv4 or IPv6 address as raw network-order bytes (IPv4 uses the first 4 bytes; the rest
/// stay zero so that == compares the whole value). A plain value type.
struct IpAddress {
  enum class Family : uint8_t { kV4 = 4, kV6 = 6 };

  Family family = Family::kV4;
  std::array<uint8_t, 16> bytes{};

  /// Parses a numeric address ("10.0.0.1", "::1", "[fe80::1]"); no name lookup.
  static std::optional<IpAddress> tryParse(const std::string& text);
  /// Like tryParse, but throws kInvalidArgument "<what>: '<text>' is not an IP address".
  static IpAddress parse(const std::string& text, const char* what = "address");

  std::string toString() const;
  bool isLoopback() const;
  bool isUnspecified() const;
  bool operator==(const IpAddress&) const = default;
};

/// A "host:port" pair as the user wrote it; host may be a name, an IPv4 or an IPv6 literal.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};

/// Parses "host:port", "[v6]:port" (a bare IPv6 literal needs the brackets). Throws
/// kInvalidArgument naming `what` (e.g. "MASTER_ADDR") when the text does not parse or the port
/// is not in 1..65535.
HostPort parseHostPort(const std::string& text, const char* what);

/// Parses a port number 1..65535; throws kInvalidArgument naming `what`.
uint16_t parsePort(const std::string& text, const char* what);

/// "1.2.3.4:5" or "[::1]:5", the form every log line and error message uses.
std::string formatEndpoint(const IpAddress& address, uint16_t port);

/// Resolves a host name or numeric address with the system resolver (Asio's), preferring an
/// IPv4 result. Blocks for as long as the resolver does (getaddrinfo has no deadline); only call
/// it at setup. Throws kInvalidArgument "cannot resolve host '<host>' (<what>): <reason>".
IpAddress resolveHost(const std::string& host, const char* what);

/// The address of network interface `ifname` (getifaddrs): its IPv4 address if it has one,
/// else its first non-link-local IPv6 address. Throws kInvalidArgument
/// "GS_SOCKET_IFNAME=<ifname>: no such interface or it has no address".
std::string interfaceAddress(const std::string& ifname);

}  // namespace gs::control
