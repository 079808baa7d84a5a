// Every rank's side of the rendezvous: dials rank 0's server (retrying until it listens),
// proves it holds the secret and checks the server does, registers its rank, and waits for the
// table of every rank's payload. The wire format is bootstrap_wire.h; the server is
// bootstrap_server.cc.

#include <algorithm>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "common/error.h"
#include "common/log.h"
#include "control/bootstrap.h"
#include "control/bootstrap_asio.h"
#include "control/bootstrap_wire.h"

namespace gs::control {
namespace {

using wire::MsgType;

}  // namespace

struct BootstrapClient::Impl {
  asio::io_context io;
  tcp::socket socket{io};
  std::string server;  // "addr:port", for messages
  int rank = 0;
  int nranks = 0;
  std::string localAddress;
  bool gathered = false;
  Clock::time_point callStart = Clock::now();  // start of the public call, for messages

  [[noreturn]] void throwTimeout(const std::string& doing) const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - callStart);
    throw Error(Errc::kTimeout,
                formatString("rendezvous with %s timed out after %lld ms %s", server.c_str(),
                             static_cast<long long>(ms.count()), doing.c_str()));
  }

  // Runs the io_context until `done` or the deadline. At the deadline it closes the socket
  // (which completes the pending operation with operation_aborted), drains, and returns false.
  bool runUntil(const bool& done, Deadline deadline) {
    io.restart();
    while (!done && !deadline.expired()) {
      io.run_one_until(deadline.at());
      if (io.stopped())
        io.restart();
    }
    if (done)
      return true;
    error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();
    return false;
  }

  void writeAll(const std::vector<uint8_t>& bytes, Deadline deadline, const char* doing) {
    bool done = false;
    error_code ec;
    asio::async_write(socket, asio::buffer(bytes), [&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!runUntil(done, deadline))
      throwTimeout(doing);
    GS_CHECK(!ec, Errc::kRemote, "rendezvous with %s: send failed %s: %s", server.c_str(), doing,
             ec.message().c_str());
  }

  void readExact(uint8_t* data, size_t len, Deadline deadline, const char* doing) {
    bool done = false;
    error_code ec;
    asio::async_read(socket, asio::buffer(data, len), [&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!runUntil(done, deadline))
      throwTimeout(doing);
    GS_CHECK(ec != asio::error::eof, Errc::kRemote,
             "rendezvous with %s: the server closed the connection %s", server.c_str(), doing);
    GS_CHECK(!ec, Errc::kRemote, "rendezvous with %s: receive failed %s: %s", server.c_str(), doing,
             ec.message().c_str());
  }

  // Reads one message of an allowed type. A Status carrying an error is thrown as the server's
  // error; other malformed input becomes kRemote naming the server.
  std::pair<MsgType, std::vector<uint8_t>> readMessage(std::initializer_list<MsgType> allowed,
                                                       Deadline deadline,
                                                       const char* doing) {
    std::array<uint8_t, wire::kHeaderBytes> header{};
    readExact(header.data(), header.size(), deadline, doing);
    wire::Header h{};
    try {
      h = wire::decodeHeader(header.data(), allowed, nranks);
    } catch (const Error& e) {
      throw Error(Errc::kRemote,
                  formatString("rendezvous with %s %s: %s", server.c_str(), doing, e.what()));
    }
    std::vector<uint8_t> body(h.bodyLen);
    readExact(body.data(), body.size(), deadline, doing);
    if (h.type == MsgType::kStatus) {
      auto [code, text] = wire::decodeStatus(body);
      if (code != Errc::kOk) {
        throw Error(code, formatString("rendezvous with %s failed for rank %d of %d: %s",
                                       server.c_str(), rank, nranks, text.c_str()));
      }
    }
    return {h.type, std::move(body)};
  }

  // Connects, retrying while nothing listens (rank 0's server may not exist yet).
  void connectWithRetry(const tcp::endpoint& ep, Deadline deadline) {
    auto backoff = std::chrono::milliseconds(10);
    std::string lastError = "no attempt finished";
    for (;;) {
      if (deadline.expired())
        throwTimeout("connecting (last error: " + lastError + ")");
      // A SYN into a black hole can take minutes to fail; cap each attempt so a server that
      // appears later is still found before the deadline.
      Deadline attempt = deadline.earlier(Deadline::afterMs(2000));
      bool done = false;
      error_code ec;
      socket.async_connect(ep, [&](error_code e) {
        ec = e;
        done = true;
      });
      if (!runUntil(done, attempt)) {
        lastError = "connect attempt timed out";
        continue;
      }
      if (!ec)
        return;
      lastError = ec.message();
      error_code ignored;
      socket.close(ignored);
      std::this_thread::sleep_for(
          std::min<std::chrono::nanoseconds>(backoff, deadline.remaining()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
  }

  void handshake(const Secret& secret, Deadline deadline) {
    wire::Nonce clientNonce = wire::randomNonce();
    writeAll(wire::frame(MsgType::kHello, clientNonce), deadline, "sending hello");
    auto [type, challenge] =
        readMessage({MsgType::kChallenge, MsgType::kStatus}, deadline, "waiting for the challenge");
    GS_CHECK(type == MsgType::kChallenge, Errc::kRemote,
             "rendezvous with %s: expected a challenge, got a status", server.c_str());
    wire::Nonce serverNonce{};
    AuthTag serverTag{};
    std::copy_n(challenge.begin(), serverNonce.size(), serverNonce.begin());
    std::copy_n(challenge.begin() + wire::kNonceBytes, serverTag.size(), serverTag.begin());
    std::vector<uint8_t> serverInput(clientNonce.begin(), clientNonce.end());
    serverInput.insert(serverInput.end(), serverNonce.begin(), serverNonce.end());
    bool serverKnowsSecret = tagsEqual(
        serverTag, authTag(secret, wire::kServerDomain, serverInput.data(), serverInput.size()));

    // Register even when the server's proof failed: the server then logs the rejected peer
    // too, and our tag reveals nothing about our secret.
    auto input = wire::registrationTagInput(serverNonce, rank, nranks);
    wire::Registration reg{rank, nranks,
                           authTag(secret, wire::kClientDomain, input.data(), input.size())};
    writeAll(wire::frame(MsgType::kRegister, wire::encodeRegistration(reg)), deadline,
             "registering");
    // Different secrets make the server's proof fail here, before the server says anything.
    GS_CHECK(serverKnowsSecret, Errc::kInvalidArgument,
             "rendezvous refused: wrong communicator secret (rank %d, server %s): the unique id "
             "or GS_SECRET differs between ranks",
             rank, server.c_str());
    readMessage({MsgType::kStatus}, deadline, "registering");
  }
};

BootstrapClient::BootstrapClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BootstrapClient::BootstrapClient(BootstrapClient&&) noexcept = default;
BootstrapClient& BootstrapClient::operator=(BootstrapClient&&) noexcept = default;
BootstrapClient::~BootstrapClient() = default;

BootstrapClient BootstrapClient::connect(const UniqueId& id,
                                         int rank,
                                         int nranks,
                                         Deadline deadline) {
  GS_CHECK(nranks >= 1 && nranks <= kMaxRendezvousRanks, Errc::kInvalidArgument,
           "nranks %d is out of range (1..%d)", nranks, kMaxRendezvousRanks);
  GS_CHECK(rank >= 0 && rank < nranks, Errc::kInvalidArgument,
           "rank %d is out of range for nranks %d", rank, nranks);
  auto impl = std::make_unique<Impl>();
  impl->server = id.endpoint();
  impl->rank = rank;
  impl->nranks = nranks;
  impl->callStart = Clock::now();
  impl->connectWithRetry(toAsioEndpoint(id.address, id.port), deadline);
  error_code ec;
  impl->socket.set_option(tcp::no_delay(true), ec);
  impl->handshake(id.secret, deadline);
  auto local = impl->socket.local_endpoint(ec);
  GS_CHECK(!ec, Errc::kSystem, "rendezvous with %s: cannot read the local address: %s",
           impl->server.c_str(), ec.message().c_str());
  impl->localAddress = local.address().to_string();
  GS_LOG_DEBUG("rendezvous: rank %d of %d joined %s from %s", rank, nranks, impl->server.c_str(),
               impl->localAddress.c_str());
  return BootstrapClient(std::move(impl));
}

int BootstrapClient::rank() const {
  return impl_->rank;
}
int BootstrapClient::nranks() const {
  return impl_->nranks;
}
std::string BootstrapClient::localAddress() const {
  return impl_->localAddress;
}

std::vector<std::vector<uint8_t>> BootstrapClient::allgather(std::span<const uint8_t> myPayload,
                                                             Deadline deadline) {
  GS_CHECK(!impl_->gathered, Errc::kInvalidArgument,
           "rendezvous allgather called twice on rank %d (the rendezvous serves one round)",
           impl_->rank);
  GS_CHECK(myPayload.size() <= kMaxRendezvousPayload, Errc::kInvalidArgument,
           "rendezvous payload of rank %d is %zu bytes, more than the %zu allowed", impl_->rank,
           myPayload.size(), kMaxRendezvousPayload);
  impl_->gathered = true;
  impl_->callStart = Clock::now();
  impl_->writeAll(wire::frame(MsgType::kPayload, myPayload), deadline, "sending the payload");
  auto [type, body] = impl_->readMessage({MsgType::kResult, MsgType::kStatus}, deadline,
                                         "waiting for all ranks to arrive");
  GS_CHECK(type == MsgType::kResult, Errc::kRemote,
           "rendezvous with %s: expected the allgather result, got a status",
           impl_->server.c_str());
  std::vector<std::vector<uint8_t>> all;
  try {
    all = wire::decodeResult(body, impl_->nranks);
  } catch (const Error& e) {
    throw Error(Errc::kRemote,
                formatString("rendezvous with %s: %s", impl_->server.c_str(), e.what()));
  }
  GS_CHECK(std::equal(myPayload.begin(), myPayload.end(), all[impl_->rank].begin(),
                      all[impl_->rank].end()),
           Errc::kRemote, "rendezvous with %s: the result holds a different payload for rank %d",
           impl_->server.c_str(), impl_->rank);
  error_code ignored;
  impl_->socket.close(ignored);
  return all;
}

}  // namespace gs::control
