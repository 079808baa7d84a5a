#include "control/bootstrap.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "common/error.h"
#include "control/bootstrap_wire.h"

namespace gs::control {
namespace {

using namespace std::chrono_literals;

Config testConfig(int64_t timeoutMs) {
  Config c;
  c.timeoutMs = timeoutMs;
  return c;
}

std::vector<uint8_t> payloadFor(int rank) {
  // Distinct contents and lengths, including an empty payload for rank 0.
  std::vector<uint8_t> p(static_cast<size_t>(rank) * 37);
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<uint8_t>(rank * 31 + i);
  return p;
}

// What one rank thread ended with.
struct RankOutcome {
  std::vector<std::vector<uint8_t>> all;
  std::string localAddress;
  std::optional<Errc> error;
  std::string message;
};

RankOutcome runRank(const UniqueId& id, int rank, int nranks, Deadline deadline) {
  RankOutcome out;
  try {
    auto client = BootstrapClient::connect(id, rank, nranks, deadline);
    out.localAddress = client.localAddress();
    out.all = client.allgather(payloadFor(rank), deadline);
  } catch (const Error& e) {
    out.error = e.code();
    out.message = e.what();
  }
  return out;
}

// Runs ranks [first, first + count) of nranks as threads.
std::vector<RankOutcome> runRanks(
    const UniqueId& id, int nranks, Deadline deadline, int first = 0, int count = -1) {
  if (count < 0)
    count = nranks - first;
  std::vector<RankOutcome> outcomes(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] { outcomes[i] = runRank(id, first + i, nranks, deadline); });
  }
  for (auto& t : threads)
    t.join();
  return outcomes;
}

void expectComplete(const RankOutcome& o, int nranks) {
  ASSERT_FALSE(o.error.has_value()) << o.message;
  ASSERT_EQ(o.all.size(), static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r)
    EXPECT_EQ(o.all[r], payloadFor(r)) << "rank " << r;
}

bool waitFinished(const RendezvousServer& server, std::chrono::milliseconds limit) {
  auto deadline = Deadline::after(limit);
  while (!server.finished() && !deadline.expired())
    std::this_thread::sleep_for(5ms);
  return server.finished();
}

class BootstrapAllgather : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapAllgather, EveryRankGetsEveryPayload) {
  const int nranks = GetParam();
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(2000));
  UniqueId id = server.uniqueId();
  EXPECT_NE(id.port, 0);
  auto outcomes = runRanks(id, nranks, Deadline::afterMs(2500));
  for (const auto& o : outcomes) {
    expectComplete(o, nranks);
    EXPECT_EQ(o.localAddress, "127.0.0.1");
  }
  EXPECT_TRUE(waitFinished(server, 1000ms)) << "the server should exit after the allgather";
}

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapAllgather, ::testing::Values(1, 2, 4, 8));

TEST(Bootstrap, WorksOverIpv6Loopback) {
  std::unique_ptr<RendezvousServer> server;
  try {
    server = std::make_unique<RendezvousServer>("::1", 0, randomSecret(), testConfig(2000));
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  UniqueId id = UniqueId::parse(server->uniqueId().serialize());
  EXPECT_EQ(id.address.family, IpAddress::Family::kV6);
  auto outcomes = runRanks(id, 2, Deadline::afterMs(2500));
  for (const auto& o : outcomes) {
    expectComplete(o, 2);
    EXPECT_EQ(o.localAddress, "::1");
  }
}

TEST(Bootstrap, UniqueIdFromRegistryRoundTripsThroughBytes) {
  UniqueId made = createUniqueId(testConfig(2000));
  EXPECT_EQ(made.address.toString(), "127.0.0.1");
  auto bytes = made.serialize();
  UniqueId parsed = UniqueId::parse(bytes);
  auto outcomes = runRanks(parsed, 2, Deadline::afterMs(2500));
  for (const auto& o : outcomes)
    expectComplete(o, 2);
  shutdownRendezvousServers();
}

TEST(Bootstrap, RegistryShutdownStopsAnIdleServer) {
  UniqueId id = createUniqueId(testConfig(2000));
  shutdownRendezvousServers();
  // Nothing listens any more: a client times out instead of hanging.
  auto start = Clock::now();
  RankOutcome o = runRank(id, 0, 1, Deadline::afterMs(200));
  EXPECT_EQ(o.error, Errc::kTimeout) << o.message;
  EXPECT_LT(Clock::now() - start, 1500ms);
}

TEST(Bootstrap, RanksMayArriveBeforeTheServer) {
  // Reserve a free port, release it, and start the server there only after the ranks began
  // retrying.
  Secret secret = randomSecret();
  uint16_t port;
  {
    RendezvousServer probe("127.0.0.1", 0, secret, testConfig(1000));
    port = probe.uniqueId().port;
  }
  UniqueId id;
  id.address = IpAddress::parse("127.0.0.1");
  id.port = port;
  id.secret = secret;
  std::vector<RankOutcome> outcomes;
  std::thread ranks([&] { outcomes = runRanks(id, 3, Deadline::afterMs(2500)); });
  std::this_thread::sleep_for(300ms);
  RendezvousServer server("127.0.0.1", port, secret, testConfig(2000));
  ranks.join();
  for (const auto& o : outcomes)
    expectComplete(o, 3);
}

TEST(Bootstrap, ConnectTimesOutWhenNoServerAppears) {
  uint16_t port;
  {
    RendezvousServer probe("127.0.0.1", 0, randomSecret(), testConfig(1000));
    port = probe.uniqueId().port;
  }
  UniqueId id;
  id.address = IpAddress::parse("127.0.0.1");
  id.port = port;
  auto start = Clock::now();
  RankOutcome o = runRank(id, 0, 2, Deadline::afterMs(300));
  auto elapsed = Clock::now() - start;
  ASSERT_EQ(o.error, Errc::kTimeout) << o.message;
  std::string expected = "rendezvous with 127.0.0.1:" + std::to_string(port) + " timed out after";
  EXPECT_EQ(o.message.rfind(expected, 0), 0u) << o.message;
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 1000ms);
}

TEST(Bootstrap, WrongSecretIsRejectedAndTheOthersComplete) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(2000));
  UniqueId good = server.uniqueId();
  UniqueId bad = good;
  bad.secret[0] ^= 0xff;
  // The impostor claims rank 0 first; the real rank 0 must still get in.
  RankOutcome impostor = runRank(bad, 0, 2, Deadline::afterMs(1000));
  ASSERT_EQ(impostor.error, Errc::kInvalidArgument);
  EXPECT_EQ(impostor.message.rfind("rendezvous refused: wrong communicator secret", 0), 0u)
      << impostor.message;
  auto outcomes = runRanks(good, 2, Deadline::afterMs(2500));
  for (const auto& o : outcomes)
    expectComplete(o, 2);
}

TEST(Bootstrap, DuplicateRankIsRejectedWithAClearMessage) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(2000));
  UniqueId id = server.uniqueId();
  auto deadline = Deadline::afterMs(2500);
  auto first = BootstrapClient::connect(id, 0, 2, deadline);
  try {
    BootstrapClient::connect(id, 0, 2, deadline);
    FAIL() << "a second rank 0 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("duplicate rank 0"), std::string::npos) << e.what();
  }
  std::thread rank1([&] { expectComplete(runRank(id, 1, 2, deadline), 2); });
  auto all = first.allgather(payloadFor(0), deadline);
  rank1.join();
  EXPECT_EQ(all[1], payloadFor(1));
}

TEST(Bootstrap, MismatchedNranksIsRejected) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(2000));
  UniqueId id = server.uniqueId();
  auto deadline = Deadline::afterMs(2500);
  auto rank0 = BootstrapClient::connect(id, 0, 2, deadline);
  RankOutcome wrong = runRank(id, 1, 3, deadline);
  ASSERT_EQ(wrong.error, Errc::kInvalidArgument);
  EXPECT_NE(wrong.message.find("nranks mismatch: rank 1 says nranks=3"), std::string::npos)
      << wrong.message;
  std::thread rank1([&] { expectComplete(runRank(id, 1, 2, deadline), 2); });
  rank0.allgather(payloadFor(0), deadline);
  rank1.join();
}

TEST(Bootstrap, ArgumentsAreCheckedBeforeConnecting) {
  UniqueId id;
  id.address = IpAddress::parse("127.0.0.1");
  id.port = 1;
  EXPECT_THROW(BootstrapClient::connect(id, 2, 2, Deadline::afterMs(100)), Error);
  EXPECT_THROW(BootstrapClient::connect(id, -1, 2, Deadline::afterMs(100)), Error);
  EXPECT_THROW(BootstrapClient::connect(id, 0, 0, Deadline::afterMs(100)), Error);
}

TEST(Bootstrap, PayloadIsBoundedAndAllgatherRunsOnce) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(2000));
  auto client = BootstrapClient::connect(server.uniqueId(), 0, 1, Deadline::afterMs(1000));
  std::vector<uint8_t> huge(kMaxRendezvousPayload + 1);
  EXPECT_THROW(client.allgather(huge, Deadline::afterMs(1000)), Error);
  std::vector<uint8_t> largest(kMaxRendezvousPayload, 0xab);
  auto all = client.allgather(largest, Deadline::afterMs(1000));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], largest);
  EXPECT_THROW(client.allgather(largest, Deadline::afterMs(1000)), Error);
}

TEST(Bootstrap, MissingRankTimesEveryoneOutNamingIt) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(500));
  auto start = Clock::now();
  auto outcomes = runRanks(server.uniqueId(), 4, Deadline::afterMs(2500), 0, 3);
  auto elapsed = Clock::now() - start;
  for (const auto& o : outcomes) {
    ASSERT_EQ(o.error, Errc::kTimeout) << o.message;
    EXPECT_NE(o.message.find("rank(s) 3 never arrived"), std::string::npos) << o.message;
  }
  EXPECT_LT(elapsed, 1500ms);
  EXPECT_TRUE(waitFinished(server, 1000ms));
}

TEST(Bootstrap, ClientDeadlineHoldsWhenTheServerWaitsLonger) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(60000));
  auto start = Clock::now();
  RankOutcome o = runRank(server.uniqueId(), 0, 2, Deadline::afterMs(300));
  ASSERT_EQ(o.error, Errc::kTimeout) << o.message;
  EXPECT_NE(o.message.find("timed out after"), std::string::npos) << o.message;
  EXPECT_LT(Clock::now() - start, 1000ms);
}

// ---- hostile peers ---------------------------------------------------------------------------

// A raw TCP client on 127.0.0.1 with a receive timeout, for talking nonsense to the server.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{2, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) == 0;
  }
  ~RawSocket() { ::close(fd_); }
  bool connected() const { return connected_; }
  void send(const std::vector<uint8_t>& bytes) {
    (void)!::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // Reads until the server closes (or 2 s pass); returns what arrived.
  std::vector<uint8_t> readToEnd() {
    std::vector<uint8_t> all;
    uint8_t buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0)
        break;
      all.insert(all.end(), buf, buf + n);
    }
    return all;
  }
  bool readExact(uint8_t* out, size_t len) {
    size_t got = 0;
    while (got < len) {
      ssize_t n = ::recv(fd_, out + got, len - got, 0);
      if (n <= 0)
        return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }

 private:
  int fd_;
  bool connected_ = false;
};

std::vector<uint8_t> rawHeader(wire::MsgType type, uint32_t bodyLen) {
  auto h = wire::frame(type, {});
  for (int i = 0; i < 4; ++i)
    h[8 + i] = static_cast<uint8_t>(bodyLen >> (8 * i));
  return h;
}

TEST(Bootstrap, GarbageAndHugeLengthsDoNotHurtTheServer) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(2000));
  UniqueId id = server.uniqueId();
  std::mt19937 rng(3);

  {  // random bytes
    RawSocket s(id.port);
    ASSERT_TRUE(s.connected());
    std::vector<uint8_t> junk(4096);
    for (auto& b : junk)
      b = static_cast<uint8_t>(rng());
    s.send(junk);
    s.readToEnd();  // the server answers with a status (or nothing) and closes
  }
  {  // a valid header announcing a 4 GiB hello
    RawSocket s(id.port);
    s.send(rawHeader(wire::MsgType::kHello, 0xffffffffu));
    auto reply = s.readToEnd();
    ASSERT_GE(reply.size(), wire::kHeaderBytes + 4);
    auto [code, text] = wire::decodeStatus(std::span(reply).subspan(wire::kHeaderBytes));
    EXPECT_NE(code, Errc::kOk);
    EXPECT_NE(text.find("malformed"), std::string::npos) << text;
  }
  {  // connect and vanish; connect and send half a header
    RawSocket a(id.port);
    RawSocket b(id.port);
    b.send({'G', 'S'});
  }
  {  // a proper hello, then a register with a huge length
    RawSocket s(id.port);
    s.send(wire::frame(wire::MsgType::kHello, wire::Nonce{}));
    std::vector<uint8_t> challenge(wire::kHeaderBytes + 2 * wire::kNonceBytes);
    ASSERT_TRUE(s.readExact(challenge.data(), challenge.size()));
    s.send(rawHeader(wire::MsgType::kRegister, 0x7fffffffu));
    s.readToEnd();
  }
  {  // an authenticated rank 1 that then announces an oversize payload
    RawSocket s(id.port);
    s.send(wire::frame(wire::MsgType::kHello, wire::Nonce{}));
    std::vector<uint8_t> challenge(wire::kHeaderBytes + 2 * wire::kNonceBytes);
    ASSERT_TRUE(s.readExact(challenge.data(), challenge.size()));
    wire::Nonce serverNonce{};
    std::copy_n(challenge.begin() + wire::kHeaderBytes, serverNonce.size(), serverNonce.begin());
    auto input = wire::registrationTagInput(serverNonce, 1, 2);
    wire::Registration reg{1, 2,
                           authTag(id.secret, wire::kClientDomain, input.data(), input.size())};
    s.send(wire::frame(wire::MsgType::kRegister, wire::encodeRegistration(reg)));
    std::vector<uint8_t> ok(wire::kHeaderBytes + 4);
    ASSERT_TRUE(s.readExact(ok.data(), ok.size()));
    EXPECT_EQ(wire::decodeStatus(std::span(ok).subspan(wire::kHeaderBytes)).first, Errc::kOk);
    s.send(rawHeader(wire::MsgType::kPayload, kMaxRendezvousPayload + 1));
    auto reply = s.readToEnd();
    ASSERT_GE(reply.size(), wire::kHeaderBytes + 4);
    EXPECT_NE(wire::decodeStatus(std::span(reply).subspan(wire::kHeaderBytes)).first, Errc::kOk);
  }
  // Rank 1's slot was freed when the hostile connection closed; the real ranks complete.
  auto outcomes = runRanks(id, 2, Deadline::afterMs(2500));
  for (const auto& o : outcomes)
    expectComplete(o, 2);
}

// Connections that never authenticate are cut after a fraction of the timeout (2000 ms: 500 ms)
// and, however many there are, cannot keep the real ranks out: past 64 the server stops
// accepting until slots free, so the ranks wait in the backlog rather than being turned away.
TEST(Bootstrap, IdleConnectionsAreCutAndDoNotStarveTheRanks) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(2000));
  UniqueId id = server.uniqueId();
  std::vector<std::unique_ptr<RawSocket>> idle;
  for (int i = 0; i < 100; ++i)
    idle.push_back(std::make_unique<RawSocket>(id.port));
  const auto start = Clock::now();
  auto outcomes = runRanks(id, 2, Deadline::afterMs(4000));
  for (const auto& o : outcomes)
    expectComplete(o, 2);
  EXPECT_LT(Clock::now() - start, 3000ms);
  auto reply = idle.front()->readToEnd();
  ASSERT_GE(reply.size(), wire::kHeaderBytes + 4) << "the idle connection was never closed";
  auto [code, text] = wire::decodeStatus(std::span(reply).subspan(wire::kHeaderBytes));
  EXPECT_EQ(code, Errc::kTimeout);
  EXPECT_NE(text.find("did not authenticate within 500 ms"), std::string::npos) << text;
}

// Before anyone registers the listener still lives only its timeout: it closes, and a
// connection that said nothing is cut.
TEST(Bootstrap, TheListenerEndsAtItsTimeoutWhenNobodyJoins) {
  RendezvousServer server("127.0.0.1", 0, randomSecret(), testConfig(300));
  const uint16_t port = server.uniqueId().port;
  RawSocket early(port);
  ASSERT_TRUE(early.connected());
  const auto start = Clock::now();
  while (!server.finished() && Clock::now() - start < 3s)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(server.finished()) << "the listener outlived its 300 ms timeout by 3 s";
  EXPECT_GE(Clock::now() - start, 250ms);
  RawSocket late(port);
  EXPECT_FALSE(late.connected()) << "still accepting after the timeout";
  EXPECT_TRUE(early.readToEnd().size() >= wire::kHeaderBytes) << "the early connection was not "
                                                                 "told anything";
}

// ---- the wire decoders on their own ------------------------------------------------------------

TEST(BootstrapWire, ResultDecoderRejectsInconsistentCountsAndLengths) {
  std::vector<uint8_t> a{1, 2, 3}, b{};
  auto good = wire::encodeResult({a, b});
  EXPECT_EQ(wire::decodeResult(good, 2), (std::vector<std::vector<uint8_t>>{a, b}));
  EXPECT_THROW(wire::decodeResult(good, 3), Error);  // count mismatch
  auto truncated = good;
  truncated.pop_back();
  EXPECT_THROW(wire::decodeResult(truncated, 2), Error);
  auto trailing = good;
  trailing.push_back(0);
  EXPECT_THROW(wire::decodeResult(trailing, 2), Error);
  auto hugeLen = good;
  hugeLen[4] = 0xff;
  hugeLen[7] = 0xff;
  EXPECT_THROW(wire::decodeResult(hugeLen, 2), Error);
  EXPECT_THROW(wire::decodeResult(std::vector<uint8_t>{1, 0}, 1), Error);
}

TEST(BootstrapWire, HeaderDecoderBoundsBodies) {
  auto h = rawHeader(wire::MsgType::kResult, 0xffffffffu);
  EXPECT_THROW(wire::decodeHeader(h.data(), {wire::MsgType::kResult}, 2), Error);
  h = rawHeader(wire::MsgType::kResult, 100);
  EXPECT_EQ(wire::decodeHeader(h.data(), {wire::MsgType::kResult}, 2).bodyLen, 100u);
  EXPECT_THROW(wire::decodeHeader(h.data(), {wire::MsgType::kStatus}, 2), Error);  // wrong type
  h = rawHeader(wire::MsgType::kHello, 15);  // fixed-size message with the wrong size
  EXPECT_THROW(wire::decodeHeader(h.data(), {wire::MsgType::kHello}, 0), Error);
  h = rawHeader(wire::MsgType::kStatus, 2);  // status without a code
  EXPECT_THROW(wire::decodeHeader(h.data(), {wire::MsgType::kStatus}, 0), Error);
  auto status = wire::encodeStatus(static_cast<Errc>(-1000), std::string("a\nb"));
  auto [code, text] = wire::decodeStatus(status);
  EXPECT_EQ(code, Errc::kRemote);
  EXPECT_EQ(text, "a?b");
}

}  // namespace
}  // namespace gs::control
