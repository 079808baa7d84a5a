// Tests specific to the tcp backend: what arrives on its listener and sockets is untrusted.
// The hello and frame layouts are spelled out here on purpose: these tests pin the wire format.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <span>

#include "tests/unit/transport/test_util.h"

namespace gs::transport::testing {
namespace {

using namespace std::chrono_literals;

uint16_t portOf(const std::vector<uint8_t>& blob) {
  uint16_t port;
  std::memcpy(&port, blob.data() + 8, 2);  // see AddressBlob in transport/sockets/handshake_wire.h
  return port;
}

// A plain blocking socket connected to 127.0.0.1:port, closed on destruction.
struct RawSocket {
  explicit RawSocket(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  ~RawSocket() { ::close(fd); }
  void sendAll(const void* p, size_t n) { ASSERT_EQ(::send(fd, p, n, MSG_NOSIGNAL), ssize_t(n)); }
  // Reads exactly n bytes within the timeout; returns how many arrived (fewer on EOF/timeout).
  size_t recvSome(void* p, size_t n, std::chrono::milliseconds timeout) {
    size_t got = 0;
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (got < n && std::chrono::steady_clock::now() < until) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0)
        continue;
      ssize_t r = ::recv(fd, static_cast<uint8_t*>(p) + got, n - got, 0);
      if (r <= 0)
        break;
      got += static_cast<size_t>(r);
    }
    return got;
  }
  int fd = -1;
};

// Polls only the receiving end (rank 1's connection to rank 0: a poll of the sender would send
// what it holds) until something lands there or `limit` passes; how many landed, into `out`.
size_t pollReceiverUntilLanded(std::vector<Rank>& ranks,
                               std::span<Completion> out,
                               std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  size_t landed = 0;
  while (landed == 0 && std::chrono::steady_clock::now() < until)
    landed = ranks[1].peers[0]->poll(out);
  return landed;
}

// In a post batch a tcp connection holds its frames until endPostBatch (or its next poll),
// then sends them: the small frames of one batch share a socket, so they leave in one writev
// and the peer reads them in one pass (a sendrecv's data and its receive notice).
TEST(TcpTransport, ABatchHoldsItsFramesUntilItEndsThenSendsThemAll) {
  auto ranks = connectRanks("tcp", 2);
  std::vector<uint8_t> src(64, 7);
  auto rs = ranks[0].device->registerMemory(src.data(), src.size());
  auto rd = ranks[1].device->allocateRegion(4096);
  Connection& conn = *ranks[0].peers[1];
  conn.beginPostBatch();
  for (uint32_t i = 0; i < 3; ++i) {
    LocalSegment seg{rs.get(), 0, src.size()};
    ASSERT_EQ(conn.postWrite({&seg, 1}, rd->remoteKey(), i * 64, 100 + i, i), PostResult::kOk);
  }
  // Held: the peer sees nothing however long it polls (the sender does not poll: its poll
  // would send them).
  Completion buf[8];
  EXPECT_EQ(pollReceiverUntilLanded(ranks, buf, 200ms), 0u);
  conn.endPostBatch();
  ASSERT_TRUE(pump(ranks, [&] {
    return countKind(ranks[1], CompletionKind::kRemoteWrite) == 3 &&
           countKind(ranks[0], CompletionKind::kWrite) == 3;
  }));
  // Outside a batch a post leaves at once, without a poll of the sender.
  ranks[1].completions.clear();
  LocalSegment seg{rs.get(), 0, 8};
  ASSERT_EQ(conn.postWrite({&seg, 1}, rd->remoteKey(), 0, 200, 9), PostResult::kOk);
  ASSERT_EQ(pollReceiverUntilLanded(ranks, buf, 3000ms), 1u);
  EXPECT_EQ(buf[0].imm, 200u);
}

// A gather (Connection::beginGather) holds every write, large ones too, until endGather, even
// inside a post batch that sends large frames at once: the chunks one engine pass posts to a
// peer leave in one writev per socket (a 1 MiB one-way send over loopback: 4 writes of 256 KiB
// cost the sender 4 x 58 us, one of 1 MiB 144 us). Nothing is lost or reordered on the way.
TEST(TcpTransport, AGatherHoldsLargeWritesUntilItEndsThenTheyLandWhole) {
  auto ranks = connectRanks("tcp", 2);
  constexpr size_t kChunk = 256 << 10;
  constexpr uint32_t kChunks = 4;
  std::vector<uint8_t> src(kChunk * kChunks);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<uint8_t>(i * 7 + i / kChunk);
  auto rs = ranks[0].device->registerMemory(src.data(), src.size());
  auto rd = ranks[1].device->allocateRegion(src.size());
  Connection& conn = *ranks[0].peers[1];
  Completion buf[8];
  conn.beginPostBatch();  // as a point-to-point run's round
  conn.beginGather();
  for (uint32_t i = 0; i < kChunks; ++i) {
    LocalSegment seg{rs.get(), i * kChunk, kChunk};
    ASSERT_EQ(conn.postWrite({&seg, 1}, rd->remoteKey(), i * kChunk, 300 + i, i), PostResult::kOk);
  }
  EXPECT_EQ(pollReceiverUntilLanded(ranks, buf, 200ms), 0u) << "a gathered write left early";
  conn.endGather();
  ranks[1].completions.clear();
  ASSERT_TRUE(pump(ranks, [&] {
    return countKind(ranks[1], CompletionKind::kRemoteWrite) == kChunks &&
           countKind(ranks[0], CompletionKind::kWrite) == kChunks;
  }));
  conn.endPostBatch();
  EXPECT_EQ(std::memcmp(rd->data(), src.data(), src.size()), 0);
  // The batch alone lets a large write leave at once (only its small frames wait).
  ranks[1].completions.clear();
  LocalSegment seg{rs.get(), 0, kChunk};
  conn.beginPostBatch();
  ASSERT_EQ(conn.postWrite({&seg, 1}, rd->remoteKey(), 0, 400, 9), PostResult::kOk);
  const size_t landed = pollReceiverUntilLanded(ranks, buf, 3000ms);
  conn.endPostBatch();
  ASSERT_EQ(landed, 1u);
  EXPECT_EQ(buf[0].imm, 400u);
}

// The hello of rank 1's only socket to rank 0: magic, version, socket index, dialer, target,
// count, reserved, mac.
void sendHelloAsRank1(RawSocket& raw) {
  uint8_t hello[40] = {};
  const uint32_t magic = 0x4c485347;
  const uint16_t version = 1, index = 0, count = 1;
  const int32_t dialer = 1, targetRank = 0;
  std::memcpy(hello + 0, &magic, 4);
  std::memcpy(hello + 4, &version, 2);
  std::memcpy(hello + 6, &index, 2);
  std::memcpy(hello + 8, &dialer, 4);
  std::memcpy(hello + 12, &targetRank, 4);
  std::memcpy(hello + 16, &count, 2);
  AuthTag mac = authTag(testSecret(), "gs-tcp-hello", hello, 24);
  std::memcpy(hello + 24, mac.data(), 16);
  raw.sendAll(hello, sizeof(hello));
}

// A write frame's header (type write, imm, region id, length, offset), without its payload.
std::vector<uint8_t> writeFrame(const MemoryRegion& region,
                                uint32_t length,
                                uint64_t offset,
                                uint32_t imm) {
  std::vector<uint8_t> header(24, 0);
  header[0] = 1;
  std::memcpy(header.data() + 4, &imm, 4);
  std::memcpy(header.data() + 8, region.remoteKey().bytes, 4);
  std::memcpy(header.data() + 12, &length, 4);
  std::memcpy(header.data() + 16, &offset, 8);
  return header;
}

// Rank 0's tcp device with a registered target of `targetBytes`, and rank 1 played by a raw
// socket that said its hello: what the socket sends reaches `conn` as rank 1's frames.
struct RawRank1 {
  explicit RawRank1(size_t targetBytes)
      : fabric(freshFabricId()),
        d0(createDevice("tcp", makeOptions(0, 2, fabric, oneSocket()))),
        d1(createDevice("tcp", makeOptions(1, 2, fabric, oneSocket()))),  // only for its blob
        target(targetBytes, 0),
        region(d0->registerMemory(target.data(), target.size())),
        raw(portOf(d0->address())) {
    sendHelloAsRank1(raw);
    conn = d0->connect(1, d1->address(), Deadline::after(3s));
    uint8_t ack[32];
    EXPECT_EQ(raw.recvSome(ack, sizeof(ack), 1s), sizeof(ack));
  }
  static RankSetup oneSocket() {
    RankSetup setup;
    setup.socketsPerPeer = 1;
    return setup;
  }
  // Polls conn, appending to *got, until it holds `count` completions or `limit` passed.
  void pollUntil(std::vector<Completion>* got, size_t count, std::chrono::milliseconds limit) {
    Completion c[64];
    const auto until = std::chrono::steady_clock::now() + limit;
    while (got->size() < count && std::chrono::steady_clock::now() < until) {
      d0->waitForActivity(std::chrono::microseconds(10'000));
      for (size_t i = 0, n = conn->poll(c); i < n; ++i)
        got->push_back(c[i]);
    }
  }

  const uint64_t fabric;
  std::unique_ptr<Device> d0, d1;
  std::vector<uint8_t> target;
  std::unique_ptr<MemoryRegion> region;
  RawSocket raw;
  std::unique_ptr<Connection> conn;
};

// Readiness (transport::Connection::appendReadinessFds / takeReadiness): the engine asks the
// kernel about a round's sockets in one poll(2), and a poll() then reads only the sockets said
// to have something. A frame waiting on a socket the check called empty stays there until a
// poll() without a check (or with one that sees it) reads it; nothing is lost either way.
TEST(TcpTransport, APollAfterAReadinessCheckReadsOnlyTheSocketsItNamed) {
  OneWayPair pair("tcp", 64, 7);
  auto& ranks = pair.ranks;
  Connection& in = *ranks[1].peers[0];
  std::vector<pollfd> fds;
  in.appendReadinessFds(fds);
  ASSERT_EQ(fds.size(), 2u) << "GS_TCP_SOCKETS' default: two sockets per peer";
  for (const pollfd& p : fds)
    EXPECT_EQ(p.events, POLLIN);
  ASSERT_EQ(pair.write(5, 1), PostResult::kOk);
  Completion got[4];
  (void)ranks[0].peers[1]->poll(got);  // flushes the write
  ASSERT_GT(::poll(fds.data(), fds.size(), 5000), 0) << "the frame never reached a socket";
  std::vector<pollfd> saidEmpty = fds;
  for (pollfd& p : saidEmpty)
    p.revents = 0;
  in.takeReadiness(saidEmpty);
  EXPECT_EQ(in.poll(got), 0u) << "a socket the check called empty was read";
  // What poll(2) sees: the socket with the frame (again until the whole frame is there).
  auto until = std::chrono::steady_clock::now() + 5s;
  size_t n = 0;
  while (n == 0 && std::chrono::steady_clock::now() < until) {
    ASSERT_GE(::poll(fds.data(), fds.size(), 100), 0);
    in.takeReadiness(fds);
    n = in.poll(got);
  }
  ASSERT_EQ(n, 1u) << in.errorMessage();
  EXPECT_EQ(got[0].kind, CompletionKind::kRemoteWrite);
  EXPECT_EQ(got[0].imm, 5u);
  const auto* landed = static_cast<const uint8_t*>(pair.rd->data());
  EXPECT_EQ(std::vector<uint8_t>(landed, landed + pair.src.size()), pair.src);
  // And a poll() with no check reads every socket, as always.
  ASSERT_EQ(pair.write(6, 2), PostResult::kOk);
  (void)ranks[0].peers[1]->poll(got);
  until = std::chrono::steady_clock::now() + 5s;
  n = 0;
  while (n == 0 && std::chrono::steady_clock::now() < until)
    n = in.poll(got);
  ASSERT_EQ(n, 1u) << in.errorMessage();
  EXPECT_EQ(got[0].imm, 6u);
}

// Landing in place (Connection::landAt): a write whose first bytes are what the landing
// expects has the rest read straight to dst; any other write (first bytes differ, another
// length, a landing cleared) lands whole where it was written and leaves dst untouched.
TEST(TcpTransport, AWriteLandsInPlaceOnlyBehindTheExpectedPrefix) {
  constexpr size_t kPrefix = 64, kRest = 300000;  // a chunk header, then more than a read
  OneWayPair pair("tcp", kPrefix + kRest, 0);
  for (size_t i = 0; i < pair.src.size(); ++i)
    pair.src[i] = static_cast<uint8_t>(i * 31 + 7);
  Connection& in = *pair.ranks[1].peers[0];
  ASSERT_TRUE(in.landsInPlace());
  auto* slot = static_cast<uint8_t*>(pair.rd->data());
  std::vector<uint8_t> dst(kRest);
  const auto receive = [&](uint32_t imm) {
    Completion got[4];
    (void)pair.ranks[0].peers[1]->poll(got);
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < until) {
      (void)pair.ranks[0].peers[1]->poll(got);
      const size_t n = in.poll(got);
      if (n > 0) {
        EXPECT_EQ(n, 1u);
        EXPECT_EQ(got[0].imm, imm);
        EXPECT_EQ(got[0].length, kPrefix + kRest);
        return got[0];
      }
    }
    ADD_FAILURE() << "write " << imm << " never arrived: " << in.errorMessage();
    return Completion{};
  };
  const auto reset = [&] {
    std::fill(slot, slot + pair.src.size(), 0xee);
    std::fill(dst.begin(), dst.end(), 0xdd);
  };
  const std::span<const uint8_t> prefix(pair.src.data(), kPrefix);
  const std::vector<uint8_t> rest(pair.src.begin() + kPrefix, pair.src.end());

  reset();
  in.landAt(slot, prefix, dst.data(), kRest);
  ASSERT_EQ(pair.write(1, 1), PostResult::kOk);
  Completion c = receive(1);
  EXPECT_EQ(c.id, Connection::kLandedInPlace);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), slot)) << "the prefix goes to the slot";
  EXPECT_EQ(dst, rest) << "the rest goes to dst";
  EXPECT_EQ(slot[kPrefix], 0xee) << "and not to the slot";

  // Every other write lands whole in the slot, dst untouched.
  const auto landsWholeInTheSlot = [&](uint32_t imm, const char* what) {
    ASSERT_EQ(pair.write(imm, imm), PostResult::kOk) << what;
    EXPECT_EQ(receive(imm).id, 0u) << what;
    EXPECT_TRUE(std::equal(pair.src.begin(), pair.src.end(), slot)) << what;
    EXPECT_EQ(dst, std::vector<uint8_t>(kRest, 0xdd)) << what;
  };
  reset();
  landsWholeInTheSlot(2, "the next write (a landing is used once)");
  reset();
  std::vector<uint8_t> other(prefix.begin(), prefix.end());
  other[9] ^= 1;
  in.landAt(slot, other, dst.data(), kRest);
  landsWholeInTheSlot(3, "first bytes other than expected (another call's header)");
  reset();
  in.landAt(slot, prefix, dst.data(), kRest - 4);
  landsWholeInTheSlot(4, "another length (an encoded chunk)");
  reset();
  in.landAt(slot, prefix, dst.data(), kRest);
  in.clearLandings();
  landsWholeInTheSlot(5, "a landing cleared before the write");
}

TEST(TcpTransport, GarbageOnListenerIsRejectedAndPeersStillConnect) {
  const uint64_t fabric = freshFabricId();
  RankSetup setup;
  auto d0 = createDevice("tcp", makeOptions(0, 2, fabric, setup));
  auto d1 = createDevice("tcp", makeOptions(1, 2, fabric, setup));
  auto b0 = d0->address(), b1 = d1->address();
  RawSocket raw(portOf(b0));
  char garbage[40];
  std::memset(garbage, 'G', sizeof(garbage));
  raw.sendAll(garbage, sizeof(garbage));
  ::testing::internal::CaptureStderr();
  std::unique_ptr<Connection> c0, c1;
  std::thread t([&] { c1 = d1->connect(0, b0, Deadline::after(3s)); });
  c0 = d0->connect(1, b1, Deadline::after(3s));
  t.join();
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("rejected tcp connection from 127.0.0.1: bad magic"), std::string::npos)
      << log;
  ASSERT_TRUE(c0 && c1);
  char byte;
  EXPECT_EQ(raw.recvSome(&byte, 1, 500ms), 0u) << "the listener kept a garbage socket open";
}

TEST(TcpTransport, HugeFrameLengthFailsConnection) {
  RawRank1 peer(4096);
  const std::vector<uint8_t> header = writeFrame(*peer.region, 0xfffffff0u, 0, 0);
  peer.raw.sendAll(header.data(), header.size());

  std::vector<Completion> got;
  peer.pollUntil(&got, 1, 2000ms);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, CompletionKind::kError);
  EXPECT_EQ(got[0].status, Errc::kRemote);
  EXPECT_NE(peer.conn->errorMessage().find("peer rank 1 sent an invalid frame"), std::string::npos)
      << peer.conn->errorMessage();
  EXPECT_EQ(peer.target, std::vector<uint8_t>(4096, 0));
  char byte;
  EXPECT_EQ(peer.raw.recvSome(&byte, 1, 500ms), 0u) << "the connection stayed open";
}

// The receiver reads ahead of the frame in hand (Connection::receive): frames of every size
// must come out whole and in order however the stream is cut, headers and payloads split
// across reads, small frames packed into one read, a payload larger than the read-ahead.
TEST(TcpTransport, FramesCutAtAnyByteLandWhole) {
  constexpr size_t kTarget = 64 << 10;
  RawRank1 peer(kTarget);
  // Payload sizes around the header and the 8 KiB read-ahead; each frame writes its own range.
  const std::vector<uint32_t> lengths = {0, 1, 23, 24, 25, 100, 8191, 8192, 8193, 20000, 0, 7};
  std::vector<uint8_t> stream, expected(kTarget, 0);
  uint64_t offset = 0;
  for (uint32_t i = 0; i < lengths.size(); ++i) {
    const std::vector<uint8_t> header = writeFrame(*peer.region, lengths[i], offset, 1000 + i);
    stream.insert(stream.end(), header.begin(), header.end());
    for (uint32_t b = 0; b < lengths[i]; ++b) {
      const auto byte = static_cast<uint8_t>(i * 37 + b * 11 + 1);
      stream.push_back(byte);
      expected[offset + b] = byte;
    }
    offset += lengths[i];
  }
  ASSERT_LE(offset, kTarget);

  for (const size_t piece : {size_t{1}, size_t{7}, size_t{97}, size_t{5000}, stream.size()}) {
    SCOPED_TRACE(piece);
    std::fill(peer.target.begin(), peer.target.end(), 0);
    std::vector<Completion> got;
    Completion c[64];
    for (size_t at = 0; at < stream.size(); at += piece) {
      peer.raw.sendAll(stream.data() + at, std::min(piece, stream.size() - at));
      if (piece < 100 && at % (piece * 16) == 0) {  // let some pieces arrive alone
        for (size_t i = 0, n = peer.conn->poll(c); i < n; ++i)
          got.push_back(c[i]);
      }
    }
    peer.pollUntil(&got, lengths.size(), 3000ms);
    ASSERT_EQ(got.size(), lengths.size()) << peer.conn->errorMessage();
    for (uint32_t i = 0; i < lengths.size(); ++i) {
      EXPECT_EQ(got[i].kind, CompletionKind::kRemoteWrite);
      EXPECT_EQ(got[i].imm, 1000 + i);
      EXPECT_EQ(got[i].length, lengths[i]);
    }
    EXPECT_EQ(peer.target, expected);
  }
  EXPECT_EQ(peer.conn->errorMessage(), "");
}

// A bad frame read ahead in the same read as good ones: the good ones before it land, the bad
// one fails the connection and writes nothing.
TEST(TcpTransport, ABadFrameBehindGoodOnesInOneReadFailsAfterThem) {
  RawRank1 peer(4096);
  std::vector<uint8_t> stream = writeFrame(*peer.region, 4, 0, 7);
  stream.insert(stream.end(), {1, 2, 3, 4});
  const std::vector<uint8_t> bad = writeFrame(*peer.region, 16, 4090, 8);  // past the end
  stream.insert(stream.end(), bad.begin(), bad.end());
  stream.insert(stream.end(), 16, 0xee);
  peer.raw.sendAll(stream.data(), stream.size());

  std::vector<Completion> got;
  peer.pollUntil(&got, 2, 2000ms);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, CompletionKind::kRemoteWrite);
  EXPECT_EQ(got[0].imm, 7u);
  EXPECT_EQ(got[1].kind, CompletionKind::kError);
  EXPECT_NE(peer.conn->errorMessage().find("outside region"), std::string::npos)
      << peer.conn->errorMessage();
  const std::vector<uint8_t> landed(peer.target.begin(), peer.target.begin() + 4);
  EXPECT_EQ(landed, (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(std::vector<uint8_t>(peer.target.begin() + 4, peer.target.end()),
            std::vector<uint8_t>(4092, 0));
}

TEST(TcpTransport, WorksOverIpv6) {
  const uint64_t fabric = freshFabricId();
  RankSetup setup;
  std::vector<Rank> ranks(2);
  for (int r = 0; r < 2; ++r) {
    DeviceOptions o = makeOptions(r, 2, fabric, setup);
    o.bindAddress = "::1";
    try {
      ranks[r].device = createDevice("tcp", o);
    } catch (const Error& e) {
      GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
    }
    ranks[r].peers.resize(2);
  }
  auto b0 = ranks[0].device->address(), b1 = ranks[1].device->address();
  std::thread t([&] { ranks[1].peers[0] = ranks[1].device->connect(0, b0, Deadline::after(3s)); });
  ranks[0].peers[1] = ranks[0].device->connect(1, b1, Deadline::after(3s));
  t.join();
  std::vector<uint8_t> src(100, 7), dst(100, 0);
  auto rs = ranks[1].device->registerMemory(src.data(), src.size());
  auto rd = ranks[0].device->registerMemory(dst.data(), dst.size());
  LocalSegment seg{rs.get(), 0, 100};
  ASSERT_EQ(ranks[1].peers[0]->postWrite({&seg, 1}, rd->remoteKey(), 0, 3, 1), PostResult::kOk);
  ASSERT_TRUE(pump(ranks, [&] { return countKind(ranks[0], CompletionKind::kRemoteWrite) == 1; }));
  EXPECT_EQ(src, dst);
}

TEST(TcpTransport, RejectsWildcardBindAddress) {
  DeviceOptions o = makeOptions(0, 1, freshFabricId(), {});
  o.bindAddress = "0.0.0.0";
  EXPECT_THROW(createDevice("tcp", o), Error);
  o.bindAddress = "not-an-ip";
  EXPECT_THROW(createDevice("tcp", o), Error);
}

}  // namespace
}  // namespace gs::transport::testing
