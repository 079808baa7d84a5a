#include "transport/verbs/qp_handshake.h"

#include "common/error.h"

namespace gs::transport::verbs {

namespace asio = boost::asio;

QpHandshake::QpHandshake(std::unique_ptr<Connection> connection, int rank)
    : connection_(std::move(connection)), mine_(connection_->localInfo(rank)) {}

bool QpHandshake::transfer(
    const uint8_t* out, size_t outBytes, size_t& sent, uint8_t* in, size_t inBytes, size_t& got) {
  sockets::Socket& socket = connection_->side();
  boost::system::error_code ec;
  if (sent < outBytes) {
    sent += socket.write_some(asio::buffer(out + sent, outBytes - sent), ec);
    GS_CHECK(!ec || ec == asio::error::would_block || ec == asio::error::try_again, Errc::kRemote,
             "verbs connect to rank %d: side channel write failed: %s", peer(),
             ec.message().c_str());
  }
  ec.clear();
  if (got < inBytes) {
    got += socket.read_some(asio::buffer(in + got, inBytes - got), ec);
    GS_CHECK(!ec || ec == asio::error::would_block || ec == asio::error::try_again, Errc::kRemote,
             "verbs connect to rank %d: the peer closed the side channel during queue-pair set-up "
             "(%s)",
             peer(), ec.message().c_str());
  }
  return sent == outBytes && got == inBytes;
}

bool QpHandshake::step() {
  if (phase_ == Phase::kExchange) {
    if (!transfer(reinterpret_cast<const uint8_t*>(&mine_), sizeof(mine_), sent_,
                  reinterpret_cast<uint8_t*>(&theirs_), sizeof(theirs_), got_)) {
      return false;
    }
    connection_->activate(theirs_);  // validates the peer's bytes first
    phase_ = Phase::kReady;
    sent_ = got_ = 0;
  }
  if (phase_ == Phase::kReady) {
    if (!transfer(&readyOut_, 1, sent_, &readyIn_, 1, got_))
      return false;
    GS_CHECK(readyIn_ == kReadyByte, Errc::kRemote,
             "verbs connect to rank %d: unexpected byte 0x%02x on the side channel", peer(),
             readyIn_);
    phase_ = Phase::kDone;
  }
  return true;
}

pollfd QpHandshake::pollFd() const {
  const size_t outBytes = phase_ == Phase::kExchange ? sizeof(mine_) : 1;
  const short events = static_cast<short>(POLLIN | (sent_ < outBytes ? POLLOUT : 0));
  return pollfd{connection_->side().native_handle(), events, 0};
}

std::string QpHandshake::progress() const {
  switch (phase_) {
    case Phase::kExchange:
      return formatString("exchanging queue pairs, %zu of %zu bytes received", got_,
                          sizeof(theirs_));
    case Phase::kReady:
      return "waiting for the peer's queue pairs to be ready";
    case Phase::kDone:
      return "ready";
  }
  return "?";
}

}  // namespace gs::transport::verbs
