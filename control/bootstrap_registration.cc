// The rendezvous protocol as rank 0's server runs it, on top of the connections that
// bootstrap_server.cc manages: answer the client's hello with a challenge, check a
// registration (the client's proof of the secret, rank and nranks against those registered
// before), collect one payload per rank, and end every connection with the table of all
// payloads, or with the timeout's status naming the ranks that never arrived.

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "control/bootstrap_server_impl.h"

namespace gs::control {
namespace {

using wire::MsgType;

// "3, 5-7, 9": the ranks that are missing, compact enough for a 1024-rank job's error message.
std::string formatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    if (!out.empty())
      out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i)
      out += "-" + std::to_string(ranks[j]);
    i = j + 1;
    if (out.size() > 600) {
      out += ", ...";
      break;
    }
  }
  return out;
}

}  // namespace

void RendezvousServer::Impl::onHello(const SessionPtr& s) {
  wire::Nonce clientNonce{};
  std::copy_n(s->body.begin(), clientNonce.size(), clientNonce.begin());
  s->serverNonce = wire::randomNonce();
  std::vector<uint8_t> tagInput(clientNonce.begin(), clientNonce.end());
  tagInput.insert(tagInput.end(), s->serverNonce.begin(), s->serverNonce.end());
  AuthTag tag = authTag(secret, wire::kServerDomain, tagInput.data(), tagInput.size());
  std::vector<uint8_t> body(s->serverNonce.begin(), s->serverNonce.end());
  body.insert(body.end(), tag.begin(), tag.end());
  send(s, wire::frame(MsgType::kChallenge, body));
  readMessage(s, {MsgType::kRegister}, [this, s] { onRegister(s); });
}

void RendezvousServer::Impl::onRegister(const SessionPtr& s) {
  wire::Registration r = wire::decodeRegistration(s->body);
  auto input = wire::registrationTagInput(s->serverNonce, r.rank, r.nranks);
  if (!tagsEqual(r.tag, authTag(secret, wire::kClientDomain, input.data(), input.size()))) {
    return reject(s, Errc::kInvalidArgument, "wrong communicator secret");
  }
  if (r.nranks < 1 || r.nranks > kMaxRendezvousRanks) {
    return reject(s, Errc::kInvalidArgument,
                  formatString("nranks %d is out of range (1..%d)", r.nranks, kMaxRendezvousRanks));
  }
  if (r.rank < 0 || r.rank >= r.nranks) {
    return reject(s, Errc::kInvalidArgument,
                  formatString("rank %d is out of range for nranks %d", r.rank, r.nranks));
  }
  if (nranks != 0 && r.nranks != nranks) {
    return reject(s, Errc::kInvalidArgument,
                  formatString("nranks mismatch: rank %d says nranks=%d but the ranks "
                               "registered before it said nranks=%d",
                               r.rank, r.nranks, nranks));
  }
  if (nranks != 0 && byRank[r.rank]) {
    return reject(s, Errc::kInvalidArgument,
                  formatString("duplicate rank %d: rank %d is already registered from %s", r.rank,
                               r.rank, byRank[r.rank]->peer.c_str()));
  }
  if (nranks == 0) {
    // The clock restarts at the first rank: from now on every rank has one timeout to
    // arrive (before, the listener's own timeout ran: see the constructor).
    nranks = r.nranks;
    byRank.assign(static_cast<size_t>(nranks), nullptr);
    timer.expires_after(std::chrono::milliseconds(timeoutMs));
    timer.async_wait([this](error_code ec) {
      if (!ec && !done)
        giveUp();
    });
  }
  s->registered = true;
  s->rank = r.rank;
  byRank[r.rank] = s;
  authenticated(s);
  GS_LOG_DEBUG("rendezvous: rank %d of %d registered from %s", r.rank, nranks, s->peer.c_str());
  send(s, wire::frame(MsgType::kStatus, wire::encodeStatus(Errc::kOk, "")));
  readMessage(s, {MsgType::kPayload}, [this, s] { onPayload(s); });
}

void RendezvousServer::Impl::onPayload(const SessionPtr& s) {
  s->payload = std::move(s->body);
  s->hasPayload = true;
  ++payloads;
  // Nothing more is expected from this client; a read that ends tells us it went away.
  readMessage(s, {MsgType::kHello}, [this, s] {
    reject(s, Errc::kInvalidArgument, "unexpected message after the payload");
  });
  if (payloads == nranks)
    complete();
}

template <class LastMessage>
void RendezvousServer::Impl::finishAll(LastMessage&& last) {
  error_code ignored;
  acceptor.close(ignored);
  timer.cancel();
  std::vector<SessionPtr> open(sessions.begin(), sessions.end());
  for (const auto& s : open) {
    sendShared(s, last(s));
    closeAfterFlush(s);
  }
}

void RendezvousServer::Impl::complete() {
  done = true;
  std::vector<std::span<const uint8_t>> all;
  for (const auto& s : byRank)
    all.emplace_back(s->payload);
  auto result = std::make_shared<const std::vector<uint8_t>>(
      wire::frame(MsgType::kResult, wire::encodeResult(all)));
  GS_LOG_INFO("rendezvous on %s complete: %d ranks", id.endpoint().c_str(), nranks);
  finishAll([&](const SessionPtr& s) {
    if (s->registered)
      return result;
    return status(Errc::kInvalidArgument, "the rendezvous is already over");
  });
}

void RendezvousServer::Impl::giveUp() {
  done = true;
  std::vector<int> missing, silent;
  for (int r = 0; r < nranks; ++r) {
    if (!byRank[r]) {
      missing.push_back(r);
    } else if (!byRank[r]->hasPayload) {
      silent.push_back(r);
    }
  }
  std::string message =
      nranks == 0 ? formatString("rendezvous timed out after %lld ms: no rank registered",
                                 static_cast<long long>(timeoutMs))
                  : formatString("rendezvous timed out after %lld ms: %d of %d ranks registered",
                                 static_cast<long long>(timeoutMs),
                                 nranks - static_cast<int>(missing.size()), nranks);
  if (!missing.empty())
    message += "; rank(s) " + formatRanks(missing) + " never arrived";
  if (!silent.empty()) {
    message += "; rank(s) " + formatRanks(silent) + " registered but sent no payload";
  }
  GS_LOG_WARN("rendezvous server on %s: %s", id.endpoint().c_str(), message.c_str());
  auto reply = status(Errc::kTimeout, message);
  finishAll([&](const SessionPtr&) { return reply; });
}

}  // namespace gs::control
