// shm-specific behaviour beyond the conformance suite: real processes, address validation,
// what peers may write into, and that no segment outlives its owner.

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "tests/unit/transport/test_util.h"
#include "transport/shm/device.h"
#include "transport/shm/segment.h"
#include "transport/shm/wire.h"

namespace gs::transport::testing {
namespace {

using namespace std::chrono_literals;

// Names under /dev/shm that processes with this pid created.
std::vector<std::string> segmentsOf(pid_t pid) {
  std::vector<std::string> out;
  const std::string prefix = "gs-" + std::to_string(pid) + "-";
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0)
        out.emplace_back(e->d_name);
    }
    closedir(dir);
  }
  return out;
}

void writeAll(int fd, const void* data, size_t n) {
  ASSERT_EQ(write(fd, data, n), static_cast<ssize_t>(n));
}

bool readAll(int fd, void* data, size_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t got = read(fd, p, n);
    if (got <= 0)
      return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

TEST(ShmTransport, WritesCrossProcessesAndAKilledPeerIsNoticed) {
  const uint64_t fabric = freshFabricId();
  auto device = createDevice("shm", makeOptions(0, 2, fabric, {}));
  auto target = device->allocateRegion(4096);
  int toChild[2], toParent[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(toParent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 1: connect, write a pattern with imm 77 into the parent's region, then wait to be
    // killed (bounded: exit after 20 s whatever happens).
    alarm(20);
    try {
      auto mine = createDevice("shm", makeOptions(1, 2, fabric, {}));
      std::vector<uint8_t> blob = mine->address();
      uint32_t size = static_cast<uint32_t>(blob.size());
      if (write(toParent[1], &size, 4) != 4 || write(toParent[1], blob.data(), size) != size)
        _exit(2);
      std::vector<uint8_t> theirs(sizeof(shm::AddressBlob));
      RemoteKey key;
      if (!readAll(toChild[0], theirs.data(), theirs.size()) ||
          !readAll(toChild[0], &key, sizeof(key)))
        _exit(3);
      auto c = mine->connect(0, theirs, Deadline::after(5s));
      std::vector<uint8_t> data(4096);
      for (size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<uint8_t>(i * 13);
      auto src = mine->registerMemory(data.data(), data.size());
      LocalSegment seg{src.get(), 0, data.size()};
      if (c->postWrite({&seg, 1}, key, 0, 77, 1) != PostResult::kOk)
        _exit(4);
      pause();
    } catch (...) {
      _exit(5);
    }
    _exit(0);
  }
  uint32_t size = 0;
  ASSERT_TRUE(readAll(toParent[0], &size, 4));
  ASSERT_EQ(size, sizeof(shm::AddressBlob));
  std::vector<uint8_t> childBlob(size);
  ASSERT_TRUE(readAll(toParent[0], childBlob.data(), size));
  EXPECT_TRUE(shm::sameDomain(childBlob, device->address()));
  std::vector<uint8_t> myBlob = device->address();
  writeAll(toChild[1], myBlob.data(), myBlob.size());
  RemoteKey key = target->remoteKey();
  writeAll(toChild[1], &key, sizeof(key));
  auto c = device->connect(1, childBlob, Deadline::after(5s));

  Completion done[4];
  const auto until = std::chrono::steady_clock::now() + 5s;
  bool landed = false;
  while (!landed && std::chrono::steady_clock::now() < until) {
    device->waitForActivity(std::chrono::microseconds(100000));
    for (size_t i = 0, n = c->poll(done); i < n; ++i) {
      ASSERT_EQ(done[i].kind, CompletionKind::kRemoteWrite) << c->errorMessage();
      EXPECT_EQ(done[i].imm, 77u);
      EXPECT_EQ(done[i].length, 4096u);
      landed = true;
    }
  }
  ASSERT_TRUE(landed);
  const auto* bytes = static_cast<const uint8_t*>(target->data());
  for (size_t i = 0; i < 4096; ++i)
    ASSERT_EQ(bytes[i], static_cast<uint8_t>(i * 13)) << i;

  kill(child, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  bool failed = false;
  while (!failed && std::chrono::steady_clock::now() < killed + 5s) {
    device->waitForActivity(std::chrono::microseconds(2000));
    for (size_t i = 0, n = c->poll(done); i < n; ++i)
      failed |= done[i].kind == CompletionKind::kError;
  }
  const auto noticed = std::chrono::steady_clock::now() - killed;
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(failed) << "a killed peer was not noticed within 5 s";
  EXPECT_LT(noticed, 1s);
  const std::string why = c->errorMessage();
  EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
  EXPECT_NE(why.find("exited"), std::string::npos) << why;
  // The killed rank could not clean up; the next device made in any process removes what it
  // left (every device sweeps, not only a process's first: this process made several already).
  c.reset();
  // (Under a parallel ctest another test process's device may sweep them first, so only the
  // outcome is checked, not who removed them.)
  auto next = createDevice("shm", makeOptions(0, 2, freshFabricId(), {}));
  EXPECT_TRUE(segmentsOf(child).empty());
  for (int fd : {toChild[0], toChild[1], toParent[0], toParent[1]})
    close(fd);
}

TEST(ShmTransport, APeerThatExitedBeforeConnectingFailsConnectAtOnce) {
  // The peer published its address and died without cleaning up (its segments stay): waiting
  // for it until the deadline would only delay the error.
  const uint64_t fabric = freshFabricId();
  int toParent[2];
  ASSERT_EQ(pipe(toParent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto mine = createDevice("shm", makeOptions(1, 2, fabric, {}));
    std::vector<uint8_t> blob = mine->address();
    if (write(toParent[1], blob.data(), blob.size()) != static_cast<ssize_t>(blob.size()))
      _exit(2);
    _exit(0);  // no destructors: what a crash leaves
  }
  std::vector<uint8_t> childBlob(sizeof(shm::AddressBlob));
  ASSERT_TRUE(readAll(toParent[0], childBlob.data(), childBlob.size()));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  auto device = createDevice("shm", makeOptions(0, 2, fabric, {}));
  const auto start = std::chrono::steady_clock::now();
  try {
    device->connect(1, childBlob, Deadline::after(10s));
    ADD_FAILURE() << "connected to an exited process";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kRemote) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 (pid " + std::to_string(child) + ") exited"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  device.reset();
  auto next = createDevice("shm", makeOptions(0, 2, freshFabricId(), {}));  // sweeps the child's
  EXPECT_TRUE(segmentsOf(child).empty());
  close(toParent[0]);
  close(toParent[1]);
}

TEST(ShmTransport, MalformedOrForeignAddressesAreRefusedNamingThePeer) {
  const uint64_t fabric = freshFabricId();
  auto a = createDevice("shm", makeOptions(0, 2, fabric, {}));
  auto b = createDevice("shm", makeOptions(1, 2, fabric, {}));
  std::vector<uint8_t> blob = b->address();
  auto expectRefused = [&](std::vector<uint8_t> bad, Errc code, const char* what) {
    try {
      a->connect(1, bad, Deadline::after(200ms));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  };
  expectRefused(std::vector<uint8_t>(blob.begin(), blob.end() - 1), Errc::kInvalidArgument,
                "short blob");
  shm::AddressBlob parsed;
  std::memcpy(&parsed, blob.data(), sizeof(parsed));
  auto withBlob = [](shm::AddressBlob x) {
    std::vector<uint8_t> v(sizeof(x));
    std::memcpy(v.data(), &x, sizeof(x));
    return v;
  };
  shm::AddressBlob escaping = parsed;
  std::strcpy(escaping.prefix, "/gs-1/../../etc");
  expectRefused(withBlob(escaping), Errc::kInvalidArgument, "a prefix that is a path");
  shm::AddressBlob unterminated = parsed;
  std::memset(unterminated.prefix, 'a', sizeof(unterminated.prefix));
  expectRefused(withBlob(unterminated), Errc::kInvalidArgument, "an unterminated prefix");
  shm::AddressBlob elsewhere = parsed;
  elsewhere.pidNamespace ^= 1;
  EXPECT_FALSE(shm::sameDomain(withBlob(elsewhere), a->address()));
  expectRefused(withBlob(elsewhere), Errc::kUnsupported, "another pid namespace");
  EXPECT_TRUE(shm::sameDomain(blob, a->address()));
  EXPECT_FALSE(shm::sameDomain(std::vector<uint8_t>(sizeof(shm::AddressBlob), 0), a->address()));
}

TEST(ShmTransport, OnlyAllocatedRegionsAreWritableAndSendsAreBounded) {
  {
    auto ranks = connectRanks("shm", 2);
    std::vector<uint8_t> src(64, 1), heap(64, 0);
    auto rs = ranks[0].device->registerMemory(src.data(), src.size());
    auto rh = ranks[1].device->registerMemory(heap.data(), heap.size());
    LocalSegment seg{rs.get(), 0, 64};
    EXPECT_EQ(ranks[0].peers[1]->postWrite({&seg, 1}, rh->remoteKey(), 0, 1, 1),
              PostResult::kError);
    EXPECT_NE(ranks[0].peers[1]->errorMessage().find("not shared memory"), std::string::npos)
        << ranks[0].peers[1]->errorMessage();
    EXPECT_EQ(heap, std::vector<uint8_t>(64, 0));
  }
  {
    auto ranks = connectRanks("shm", 2);
    std::vector<uint8_t> big(shm::kMessageBytes + 1, 2);
    auto rb = ranks[0].device->registerMemory(big.data(), big.size());
    EXPECT_EQ(ranks[0].peers[1]->postSend({rb.get(), 0, big.size()}, 1), PostResult::kError);
    EXPECT_NE(ranks[0].peers[1]->errorMessage().find("at most 4096 bytes"), std::string::npos)
        << ranks[0].peers[1]->errorMessage();
  }
}

// The notice queue's slots carry their sequence (wire.h, Notice): a receiver takes the next
// notice when its slot holds the expected one, waits while it holds the lap before, and fails
// naming the peer on anything else, never taking a scribbled slot as a write. (Laps and a full
// queue: TransportTest.ManyWritesInFlightWithBackPressure.)
TEST(ShmTransport, AScribbledNoticeSequenceFailsTheReceiverNamingThePeer) {
  OneWayPair pair("shm", 64, 1);
  auto& ranks = pair.ranks;
  Completion got[4];
  ASSERT_EQ(pair.write(41, 1), PostResult::kOk);
  ASSERT_EQ(ranks[1].peers[0]->poll(got), 1u);
  EXPECT_EQ(got[0].imm, 41u);
  EXPECT_EQ(ranks[1].peers[0]->poll(got), 0u) << "slot 1 holds nothing yet: no notice";
  // The connection's segment as a misbehaving rank 0 could write it: made by the dialer (rank
  // 1, "<its prefix>-c0") and unlinked once both mapped it, so it is found among this
  // process's mappings (both ranks are threads here). halves[0] is what the lower rank sends.
  shm::ConnectionBlock* c = nullptr;
  {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (c == nullptr && std::getline(maps, line)) {
      if (line.find("-c0 (deleted)") != std::string::npos)
        c = reinterpret_cast<shm::ConnectionBlock*>(std::stoull(line, nullptr, 16));
    }
  }
  ASSERT_NE(c, nullptr) << "no mapping of the connection's segment in /proc/self/maps";
  shm::Notice& next = c->halves[0].notices[1];
  next.kind = static_cast<uint32_t>(shm::NoticeKind::kWrite);
  next.imm = 42;
  std::atomic_ref<uint64_t>(next.sequence).store(7, std::memory_order_release);
  EXPECT_EQ(ranks[1].peers[0]->poll(got), 1u);
  EXPECT_EQ(got[0].kind, CompletionKind::kError);
  EXPECT_NE(ranks[1].peers[0]->errorMessage().find(
                "peer rank 0 sent an invalid frame: its notice queue is corrupt"),
            std::string::npos)
      << ranks[1].peers[0]->errorMessage();
}

// Two ranks of this process connected over shm: a is rank 0's end, b rank 1's.
struct ShmPair {
  decltype(connectRanks("shm", 2)) ranks = connectRanks("shm", 2);
  Connection& a = *ranks[0].peers[1];
  Connection& b = *ranks[1].peers[0];
};

// The small-exchange mailboxes: exchanges alternate between two boxes per direction, a poll
// before the peer posted finds nothing, a length past the box (a misbehaving peer) fails the
// connection naming it instead of reading beyond, and a failure flag reaches a waiting peer
// (with the peer's part, when that came first), except for exchanges whose calls the failing
// peer had completed.
TEST(ShmTransport, SmallExchangesAlternateMailboxesAndRefuseOversizedOnes) {
  {
    ShmPair pair;
    Connection &a = pair.a, &b = pair.b;
    ASSERT_EQ(a.smallExchangeBytes(), shm::kSmallBytes);
    SmallArrival got;
    for (uint64_t s = 1; s <= 5; ++s) {
      std::vector<uint8_t> fromA(100 + s, static_cast<uint8_t>(s)), fromB(100 + s, 0);
      for (size_t i = 0; i < fromB.size(); ++i)
        fromB[i] = static_cast<uint8_t>(i + 3 * s);
      EXPECT_EQ(b.pollSmall(s, &got), SmallPoll::kPending) << "exchange " << s;
      a.postSmall(s, 1000 + s, fromA.data(), static_cast<uint32_t>(fromA.size()));
      EXPECT_EQ(b.peerSmallSequence(), s);
      ASSERT_EQ(b.pollSmall(s, &got), SmallPoll::kArrived) << b.errorMessage();
      EXPECT_EQ(got.tag, 1000 + s);
      ASSERT_EQ(got.bytes, fromA.size());
      EXPECT_EQ(std::vector<uint8_t>(got.data, got.data + got.bytes), fromA);
      b.postSmall(s, 2000 + s, fromB.data(), static_cast<uint32_t>(fromB.size()));
      ASSERT_EQ(a.pollSmall(s, &got), SmallPoll::kArrived) << a.errorMessage();
      EXPECT_EQ(got.tag, 2000 + s);
      EXPECT_EQ(std::vector<uint8_t>(got.data, got.data + got.bytes), fromB);
    }
    // A length past the mailbox: refused, never read.
    std::vector<uint8_t> full(shm::kSmallBytes, 7);
    a.postSmall(6, 1, full.data(), static_cast<uint32_t>(shm::kSmallBytes + 1));
    EXPECT_EQ(b.pollSmall(6, &got), SmallPoll::kFailed);
    EXPECT_NE(b.errorMessage().find("peer rank 0 posted a small exchange of 16385 bytes"),
              std::string::npos)
        << b.errorMessage();
  }
  {
    auto ranks = connectRanks("shm", 2);
    SmallArrival got;
    ranks[0].peers[1]->postSmallFailure(0);
    EXPECT_EQ(ranks[1].peers[0]->pollSmall(1, &got), SmallPoll::kPeerFailed);
    EXPECT_EQ(got.data, nullptr) << "nothing was posted";
  }
  // The peer posts its part of exchange 1, then fails having completed the calls of exchanges
  // up to completedThrough.
  const auto postedThenFailed = [](uint64_t completedThrough) {
    auto ranks = connectRanks("shm", 2);
    const uint8_t part[3] = {1, 2, 3};
    ranks[0].peers[1]->postSmall(1, 77, part, 3);
    ranks[0].peers[1]->postSmallFailure(completedThrough);
    return ranks;
  };
  {
    // Failed in that call: the flag decides, and the part is described (a mismatch the caller
    // finds in it is the cause).
    auto ranks = postedThenFailed(0);
    SmallArrival got;
    EXPECT_EQ(ranks[1].peers[0]->pollSmall(1, &got), SmallPoll::kPeerFailed);
    ASSERT_NE(got.data, nullptr);
    EXPECT_EQ(got.tag, 77u);
    EXPECT_EQ(got.bytes, 3u);
  }
  {
    // Completed that call and failed in a later one: the exchange stands (its peer may read it
    // after the failure), the next one fails.
    auto ranks = postedThenFailed(1);
    SmallArrival got;
    EXPECT_EQ(ranks[1].peers[0]->pollSmall(1, &got), SmallPoll::kArrived);
    EXPECT_EQ(got.tag, 77u);
    EXPECT_EQ(ranks[1].peers[0]->pollSmall(2, &got), SmallPoll::kPeerFailed);
  }
}

// Message boxes (point-to-point messages of up to 4 KiB): a use arrives with its number,
// dtype, count and payload; a box is reused only once its previous use was taken, so a sender
// that runs kMessageBoxes uses ahead of its receiver waits; a receiver finds a use it did not
// expect by the message's number (boxHolds); a length past the box fails the receiver.
TEST(ShmTransport, MessageBoxesAreReusedOnlyOnceTakenAndRefuseOversizedOnes) {
  ShmPair pair;
  Connection &a = pair.a, &b = pair.b;
  ASSERT_EQ(a.messageBoxBytes(), shm::kMessageBoxBytes);
  BoxArrival got;
  EXPECT_EQ(b.pollBox(1, &got), BoxPoll::kPending);
  std::vector<std::vector<uint8_t>> payloads;
  for (uint64_t s = 1; s <= shm::kMessageBoxes; ++s) {
    payloads.emplace_back(8 * s, static_cast<uint8_t>(s));
    ASSERT_TRUE(a.postBox(s, static_cast<uint32_t>(10 + s), 3, s, payloads.back().data(),
                          static_cast<uint32_t>(payloads.back().size())))
        << "use " << s;
  }
  const uint64_t next = shm::kMessageBoxes + 1;
  const std::vector<uint8_t> last(16, 0xab);
  EXPECT_FALSE(a.postBox(next, 99, 3, 2, last.data(), 16)) << "box 1 is not taken yet";
  EXPECT_TRUE(b.boxHolds(3, 13, &got)) << "use 3 holds message 13";
  EXPECT_EQ(got.count, 3u);
  EXPECT_FALSE(b.boxHolds(4, 13, &got)) << "message 13 is use 3, before the uses asked about";
  ASSERT_EQ(b.pollBox(1, &got), BoxPoll::kArrived) << b.errorMessage();
  EXPECT_EQ(got.ordinal, 11u);
  EXPECT_EQ(got.dtype, 3u);
  EXPECT_EQ(got.count, 1u);
  EXPECT_EQ(std::vector<uint8_t>(got.data, got.data + got.bytes), payloads[0]);
  EXPECT_FALSE(a.boxTaken(1));
  b.takeBox(1);
  EXPECT_TRUE(a.boxTaken(1));
  ASSERT_TRUE(a.postBox(next, 99, 3, 2, last.data(), 16)) << "box 1 was taken";
  ASSERT_EQ(b.pollBox(next, &got), BoxPoll::kArrived) << b.errorMessage();
  EXPECT_EQ(got.ordinal, 99u);
  EXPECT_EQ(std::vector<uint8_t>(got.data, got.data + got.bytes), last);
  // A length past the box: refused, never read.
  for (uint64_t s = 2; s <= shm::kMessageBoxes; ++s)
    b.takeBox(s);
  b.takeBox(next);
  std::vector<uint8_t> full(shm::kMessageBoxBytes, 7);
  ASSERT_TRUE(a.postBox(next + 1, 100, 3, 1, full.data(),
                        static_cast<uint32_t>(shm::kMessageBoxBytes + 1)));
  EXPECT_EQ(b.pollBox(next + 1, &got), BoxPoll::kFailed);
  EXPECT_NE(b.errorMessage().find("peer rank 0 posted a message of 4097 bytes in a box"),
            std::string::npos)
      << b.errorMessage();
}

// A receiver's expectation (expectBox) lets its sender complete a boxed send before the take,
// only for exactly the message expected in that use: another ordinal, dtype or count, or a use
// of the box the receiver has not reached, is not accepted (the take still is). The receiver
// writes a use's expectation only once the box's previous use is taken.
TEST(ShmTransport, AnExpectationAcceptsOnlyTheMessageItDescribes) {
  ShmPair pair;
  Connection &a = pair.a, &b = pair.b;
  const std::vector<uint8_t> payload(8, 1);
  ASSERT_TRUE(a.postBox(1, 7, 3, 2, payload.data(), 8));
  EXPECT_FALSE(a.boxAccepted(1, 7, 3, 2)) << "nothing expected or taken yet";
  ASSERT_TRUE(b.expectBox(1, 7, 3, 2));
  EXPECT_TRUE(a.boxAccepted(1, 7, 3, 2));
  EXPECT_FALSE(a.boxTaken(1)) << "accepted, not taken: the box stays in use";
  EXPECT_FALSE(a.boxAccepted(1, 8, 3, 2)) << "another message number";
  EXPECT_FALSE(a.boxAccepted(1, 7, 4, 2)) << "another dtype";
  EXPECT_FALSE(a.boxAccepted(1, 7, 3, 3)) << "another count";
  EXPECT_FALSE(a.boxAccepted(2, 7, 3, 2)) << "another use";

  // A disagreeing expectation: not accepted until the receiver takes the box (it would fail
  // instead: the engine compares the box with its receive first).
  ASSERT_TRUE(a.postBox(2, 8, 3, 5, payload.data(), 8));
  ASSERT_TRUE(b.expectBox(2, 8, 3, 4));
  EXPECT_FALSE(a.boxAccepted(2, 8, 3, 5));
  b.takeBox(2);
  EXPECT_TRUE(a.boxAccepted(2, 8, 3, 5)) << "taken";

  // Use kMessageBoxes + 1 shares box 1, whose use 1 is not taken: no expectation yet, and use
  // 1's stays readable.
  const uint64_t next = shm::kMessageBoxes + 1;
  EXPECT_FALSE(b.expectBox(next, 20, 3, 2));
  EXPECT_TRUE(a.boxAccepted(1, 7, 3, 2));
  b.takeBox(1);
  ASSERT_TRUE(b.expectBox(next, 20, 3, 2));
  EXPECT_TRUE(a.boxAccepted(1, 7, 3, 2)) << "use 1 was taken";
  ASSERT_TRUE(a.postBox(next, 20, 3, 2, payload.data(), 8));
  EXPECT_TRUE(a.boxAccepted(next, 20, 3, 2));
}

// A peer's small exchange wakes a rank waiting on its device once: a rank in a chunked call
// whose peer already went on to its next, small call (having sent all this rank needed) must
// be able to sleep again until its own data comes. Before, every wait returned at once until
// the exchange was read, and the rank spun on a core its peers needed (4 ranks on 2 cores: a
// 256 KiB reduce after a mailbox barrier took 2-9 ms instead of 0.1-0.2).
TEST(ShmTransport, APeersSmallExchangeIsNewsOnceToAWaitingRank) {
  auto ranks = connectRanks("shm", 2);
  Completion sink[4];
  (void)ranks[1].peers[0]->poll(sink);  // reads the peer's hello, itself news until read
  const uint8_t part[8] = {};
  ranks[0].peers[1]->postSmall(1, 5, part, sizeof(part));
  const auto waited = [&](std::chrono::milliseconds most) {
    const auto start = std::chrono::steady_clock::now();
    ranks[1].device->waitForActivity(most);
    return std::chrono::steady_clock::now() - start;
  };
  EXPECT_LT(waited(5000ms), 2500ms) << "the exchange did not wake the rank";
  EXPECT_GE(waited(100ms), 80ms) << "the same exchange woke the rank again";
  // A later exchange is news again, and the first is still there to be read.
  SmallArrival got;
  ASSERT_EQ(ranks[1].peers[0]->pollSmall(1, &got), SmallPoll::kArrived);
  ranks[0].peers[1]->postSmall(2, 5, part, sizeof(part));
  EXPECT_LT(waited(5000ms), 2500ms) << "the next exchange did not wake the rank";
}

// The single copy (GS_SHM_SINGLE_COPY): each end probes whether it can read its peer's memory
// (process_vm_readv of the peer's token) and says so in its hello; a sender may leave chunks
// in its memory only for a peer that can. Ranks here are threads of one process, so the read
// itself always works: the cross-process path is SingleCopy.* in tests/integration.
TEST(ShmTransport, PeersReadEachOthersMemoryOnlyWhereBothAllowIt) {
  {
    auto ranks = connectRanks("shm", 2);
    // The dialer (rank 1) learns the acceptor's answer from its hello, in poll.
    EXPECT_TRUE(pump(ranks, [&] {
      return ranks[0].peers[1]->peerReadsOurMemory() && ranks[1].peers[0]->peerReadsOurMemory();
    }));
    std::vector<uint8_t> theirs(100000), mine(100000, 0);
    for (size_t i = 0; i < theirs.size(); ++i)
      theirs[i] = static_cast<uint8_t>(i * 7);
    std::string why;
    EXPECT_TRUE(ranks[1].peers[0]->readPeerMemory(reinterpret_cast<uintptr_t>(theirs.data()),
                                                  mine.data(), mine.size(), &why))
        << why;
    EXPECT_EQ(mine, theirs);
    // A reference to memory the peer does not have fails the read, naming why.
    EXPECT_FALSE(ranks[1].peers[0]->readPeerMemory(8, mine.data(), 16, &why));
    EXPECT_NE(why.find("process_vm_readv"), std::string::npos) << why;
  }
  {
    // Rank 1 opts out: it neither reads rank 0 nor lets rank 0 read it.
    const uint64_t fabric = freshFabricId();
    DeviceOptions o0 = makeOptions(0, 2, fabric, {}), o1 = makeOptions(1, 2, fabric, {});
    o1.config.shmSingleCopy = false;
    std::vector<Rank> ranks(2);
    ranks[0].device = createDevice("shm", o0);
    ranks[1].device = createDevice("shm", o1);
    const auto blob0 = ranks[0].device->address(), blob1 = ranks[1].device->address();
    ranks[0].peers.resize(2);
    ranks[1].peers.resize(2);
    std::thread acceptor(
        [&] { ranks[0].peers[1] = ranks[0].device->connect(1, blob1, Deadline::after(5s)); });
    ranks[1].peers[0] = ranks[1].device->connect(0, blob0, Deadline::after(5s));
    acceptor.join();
    ASSERT_TRUE(ranks[0].peers[1] && ranks[1].peers[0]);
    pump(
        ranks, [] { return false; }, 100ms);
    EXPECT_FALSE(ranks[0].peers[1]->peerReadsOurMemory());
    EXPECT_FALSE(ranks[1].peers[0]->peerReadsOurMemory());
  }
}

TEST(ShmTransport, NoSegmentOutlivesItsOwner) {
  const pid_t self = getpid();
  ASSERT_TRUE(segmentsOf(self).empty());
  {
    auto ranks = connectRanks("shm", 3);
    auto region = ranks[0].device->allocateRegion(1 << 20);
    // Per device its control segment, plus the region; connection names are gone once both
    // ends mapped them.
    EXPECT_EQ(segmentsOf(self).size(), 3u + 1u);
  }
  EXPECT_TRUE(segmentsOf(self).empty());
}

}  // namespace
}  // namespace gs::transport::testing
