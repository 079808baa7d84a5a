#pragma once

#include <poll.h>

#include <memory>
#include <string>

#include "transport/verbs/connection.h"
#include "transport/verbs/wire.h"

namespace gs::transport::verbs {

/// Queue-pair set-up with one peer over the connection's side channel, as a non-blocking state
/// machine: send our QpExchange and read the peer's, activate the QPs (RTR, RTS), then send the
/// ready byte and read the peer's (after it, writes may flow both ways). The dialing rank runs
/// it inside connect(); the accepting rank advances it from the listener's service hook, so a
/// rank blocked connecting to someone else still answers peers that dialed it.
class QpHandshake {
 public:
  QpHandshake(std::unique_ptr<Connection> connection, int rank);

  /// Advances as far as possible without blocking; true once the connection is ready.
  /// Throws (kRemote, kTimeout-free) when the peer closes the channel or sends invalid data.
  bool step();
  /// The side channel with the events the next step waits for, for poll().
  pollfd pollFd() const;
  /// Where it stands, for timeout messages.
  std::string progress() const;
  std::unique_ptr<Connection> release() { return std::move(connection_); }
  int peer() const { return connection_->peer(); }

 private:
  enum class Phase { kExchange, kReady, kDone };
  bool transfer(
      const uint8_t* out, size_t outBytes, size_t& sent, uint8_t* in, size_t inBytes, size_t& got);

  std::unique_ptr<Connection> connection_;
  Phase phase_ = Phase::kExchange;
  QpExchange mine_{};
  QpExchange theirs_{};
  size_t sent_ = 0, got_ = 0;
  uint8_t readyOut_ = kReadyByte;
  uint8_t readyIn_ = 0;
};

}  // namespace gs::transport::verbs
