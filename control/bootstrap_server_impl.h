#pragma once

// RendezvousServer's state, shared by the two files that implement it:
//   bootstrap_server.cc        the listener and its connections: binding, accepting within the
//                              caps on unauthenticated connections, framed reads, queued
//                              writes, closing;
//   bootstrap_registration.cc  the protocol on top: challenge, registration checks, payloads,
//                              and the last message to every rank (the table, or the timeout).
// Private to those two files. Everything but the constructor, stop() and `finished` runs on
// the server's own thread.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "control/bootstrap.h"
#include "control/bootstrap_asio.h"
#include "control/bootstrap_wire.h"

namespace gs::control {

/// One accepted connection. Lives while a handler or the server's tables refer to it.
struct RendezvousSession {
  RendezvousSession(tcp::socket s, std::string peerText)
      : socket(std::move(s)), peer(std::move(peerText)), authTimer(socket.get_executor()) {}

  tcp::socket socket;
  std::string peer;
  asio::steady_timer authTimer;  // closes the connection unless it registers in time
  bool authenticating = true;    // counted in RendezvousServer::Impl::unauthenticated
  std::array<uint8_t, wire::kHeaderBytes> header{};
  std::vector<uint8_t> body;
  wire::Nonce serverNonce{};
  int rank = -1;
  bool registered = false;
  bool hasPayload = false;
  bool closed = false;
  std::vector<uint8_t> payload;
  std::deque<std::shared_ptr<const std::vector<uint8_t>>> outbox;
  bool writing = false;
  bool closeWhenFlushed = false;
};
using SessionPtr = std::shared_ptr<RendezvousSession>;
using SharedBytes = std::shared_ptr<const std::vector<uint8_t>>;

struct RendezvousServer::Impl {
  // ---- bootstrap_server.cc: the listener and its connections ----

  /// Binds and listens (throws as RendezvousServer's constructor says), then starts the thread.
  Impl(const std::string& address, uint16_t port, const Secret& s, const Config& config);
  ~Impl() { stop(); }
  void stop();

  /// How long a connection may take from accept to a valid registration: a fraction of the
  /// timeout, so connections that never authenticate cannot hold the listener's slots.
  static int64_t authDeadlineMs(int64_t timeoutMs) {
    return std::clamp<int64_t>(timeoutMs / 4, 100, 5000);
  }

  void acceptNext();
  /// A connection left the unauthenticated pool (registered or closed): maybe accept again.
  void authenticated(const SessionPtr& s);
  /// Reads one message whose type is in `allowed` into session->body, then calls `next`.
  void readMessage(const SessionPtr& s,
                   std::initializer_list<wire::MsgType> allowed,
                   std::function<void()> next);
  /// Sends a Status with the reason, then closes the connection.
  void reject(const SessionPtr& s, Errc code, const std::string& why);
  void send(const SessionPtr& s, std::vector<uint8_t> bytes);
  /// Queues bytes that several sessions may share (the table, the timeout's status).
  void sendShared(const SessionPtr& s, SharedBytes bytes);
  void writeNext(const SessionPtr& s);
  void closeAfterFlush(const SessionPtr& s);
  void onConnectionLost(const SessionPtr& s, const error_code& ec);
  void close(const SessionPtr& s);

  static SharedBytes status(Errc code, const std::string& text) {
    return std::make_shared<const std::vector<uint8_t>>(
        wire::frame(wire::MsgType::kStatus, wire::encodeStatus(code, text)));
  }

  // ---- bootstrap_registration.cc: the protocol ----

  void onHello(const SessionPtr& s);
  void onRegister(const SessionPtr& s);
  void onPayload(const SessionPtr& s);
  /// Every rank sent its payload: send each the table.
  void complete();
  /// The timeout ran out: tell every connection which ranks never arrived.
  void giveUp();
  /// Sends each open session its last message, then closes it; stops accepting.
  template <class LastMessage>
  void finishAll(LastMessage&& last);

  // ---- state ----

  /// Connections accepted but not yet registered, at most: beyond it accepting pauses.
  static constexpr int kMaxUnauthenticated = 64;

  Secret secret;
  int64_t timeoutMs;
  int64_t authMs;  // authDeadlineMs(timeoutMs)
  UniqueId id;
  // Declared before everything that holds sockets or handlers, so it is destroyed last.
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer timer;
  std::set<SessionPtr> sessions;   // every open connection
  std::vector<SessionPtr> byRank;  // registered connection per rank (size nranks once known)
  int nranks = 0;                  // 0 until the first registration
  int payloads = 0;
  int unauthenticated = 0;    // sessions with authenticating set
  bool acceptPaused = false;  // acceptNext() found the pool full
  bool done = false;          // result or timeout sent; nothing new is accepted
  std::atomic<bool> finished{false};
  std::mutex stopMutex;
  pid_t creatorPid;
  std::thread thread;
};

}  // namespace gs::control
