#pragma once

// What the rendezvous server (bootstrap_server*.{h,cc}, bootstrap_registration.cc) and client
// (bootstrap_client.cc) share on the Asio side: short names and the endpoint conversion.
// Private to those files: control/'s public headers stay free of Boost.Asio (see net.h).

#include <algorithm>
#include <cstdint>

#include <boost/asio/ip/tcp.hpp>

#include "control/net.h"

namespace gs::control {

namespace asio = boost::asio;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

/// The TCP endpoint of an IpAddress and port: where the server listens, what a client dials.
inline tcp::endpoint toAsioEndpoint(const IpAddress& a, uint16_t port) {
  namespace ip = asio::ip;
  if (a.family == IpAddress::Family::kV4) {
    ip::address_v4::bytes_type b;
    std::copy_n(a.bytes.begin(), 4, b.begin());
    return {ip::address_v4(b), port};
  }
  ip::address_v6::bytes_type b;
  std::copy_n(a.bytes.begin(), 16, b.begin());
  return {ip::address_v6(b), port};
}

}  // namespace gs::control
