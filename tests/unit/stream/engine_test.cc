// Engine over the real loopback transport: ranks as threads run collectives correctly; a
// hostile peer writing garbage or inconsistent chunks into our slots makes Engine::run throw
// gs::Error naming it (never crash); a silent peer gives kTimeout naming it.
#include "stream/engine.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "format/chunk_header.h"
#include "stream/link.h"
#include "tests/unit/stream/ring_cluster.h"
#include "transport/device.h"

namespace gs::stream {
namespace {

using Cluster = RingCluster;  // one loopback fabric

// Runs fn(rank) on one thread per rank and returns each rank's error ("" when none).
template <class F>
std::vector<std::string> onEveryRank(int n, F fn) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return errors;
}

float inputOf(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 997));
}

TEST(Engine, AllReduceAcrossRanksOutOfPlaceAndInPlace) {
  // 10007 floats (40 KB) takes the one-round exchange for N=2; 80021 (320 KB) the ring.
  static_assert(10007 * 4 <= kExchangeMaxBytes && 80021 * 4 > kExchangeMaxBytes);
  for (auto [n, count] : {std::pair<int, size_t>{2, 10007}, {2, 80021}, {3, 10007}, {4, 40009}}) {
    Cluster cluster(n, testConfig());
    std::vector<std::vector<float>> send(n), recv(n), inplace(n);
    for (int r = 0; r < n; ++r) {
      send[r].resize(count);
      for (size_t i = 0; i < count; ++i)
        send[r][i] = inputOf(r, i);
      recv[r].assign(count, -1.0f);
      inplace[r] = send[r];
    }
    auto errors = onEveryRank(n, [&](int r) {
      CollectiveArgs a;
      a.kind = CollectiveKind::kAllReduce;
      a.send = send[r].data();
      a.recv = recv[r].data();
      a.count = count;
      a.dtype = DataType::kFloat32;
      a.op = ReduceOp::kSum;
      cluster.ranks[r].engine->run(a);
      // Second collective, in place (sequence numbers continue on the links).
      a.send = inplace[r].data();
      a.recv = inplace[r].data();
      cluster.ranks[r].engine->run(a);
    });
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(errors[r], "") << "N=" << n << " rank " << r;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q)
          want += inputOf(q, i);  // small integers: exact
        ASSERT_EQ(recv[r][i], want) << "N=" << n << " rank " << r << " i=" << i;
        ASSERT_EQ(inplace[r][i], want) << "in place, N=" << n << " rank " << r << " i=" << i;
      }
      EXPECT_EQ(cluster.ranks[r].engine->collectivesRun(), 2u);
      EXPECT_GT(cluster.ranks[r].engine->lastStats().chunksSent, 0u);
    }
  }
}

// The exchange reduces op(lower rank's value, higher rank's value) on both ranks, so replicas
// are bit-identical even where the operand order shows: NaN payloads, and min/max of -0/+0.
TEST(Engine, ExchangeReplicasAreBitIdentical) {
  Cluster cluster(2, testConfig());
  const size_t count = 8;
  auto nanWithPayload = [](uint32_t payload) {
    const uint32_t bits = 0x7fc00000u | payload;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  std::vector<std::vector<float>> send(2, std::vector<float>(count)),
      out(2, std::vector<float>(count));
  for (size_t i = 0; i < count; ++i) {
    send[0][i] = i % 2 ? nanWithPayload(0x111 + static_cast<uint32_t>(i)) : 0.0f;
    send[1][i] = i % 2 ? nanWithPayload(0x222 + static_cast<uint32_t>(i)) : -0.0f;
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    auto errors = onEveryRank(2, [&](int r) {
      CollectiveArgs a;
      a.send = send[r].data();
      a.recv = out[r].data();
      a.count = count;
      a.op = op;
      cluster.ranks[r].engine->run(a);
    });
    ASSERT_EQ(errors[0], "");
    ASSERT_EQ(errors[1], "");
    EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), count * 4), 0) << reduceOpName(op);
  }
}

TEST(Engine, OtherCollectivesAndAverage) {
  const int n = 3;
  Cluster cluster(n, testConfig());
  const size_t count = 3001;
  std::vector<std::vector<int32_t>> send(n), avg(n), rs(n), ag(n), bc(n);
  for (int r = 0; r < n; ++r) {
    send[r].resize(count * n);
    for (size_t i = 0; i < send[r].size(); ++i)
      send[r][i] = static_cast<int32_t>(i * 7 + r * 100000);
    avg[r].resize(count);
    rs[r].resize(count);
    ag[r].resize(count * n);
    bc[r].assign(count, r == 1 ? 0 : -5);
  }
  auto errors = onEveryRank(n, [&](int r) {
    Engine& e = *cluster.ranks[r].engine;
    CollectiveArgs a;
    a.dtype = DataType::kInt32;
    a.kind = CollectiveKind::kAllReduce;
    a.op = ReduceOp::kAvg;
    a.send = send[r].data();
    a.recv = avg[r].data();
    a.count = count;
    e.run(a);
    a.kind = CollectiveKind::kReduceScatter;
    a.op = ReduceOp::kMax;
    a.recv = rs[r].data();
    e.run(a);
    a.kind = CollectiveKind::kAllGather;
    a.recv = ag[r].data();
    e.run(a);
    a.kind = CollectiveKind::kBroadcast;
    a.root = 1;
    a.recv = bc[r].data();
    e.run(a);
  });
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      int64_t sum = 0;
      for (int q = 0; q < n; ++q)
        sum += send[q][i];
      ASSERT_EQ(avg[r][i], static_cast<int32_t>(sum / n)) << r << " " << i;
      int32_t mx = INT32_MIN;
      for (int q = 0; q < n; ++q)
        mx = std::max(mx, send[q][r * count + i]);
      ASSERT_EQ(rs[r][i], mx) << r << " " << i;
      ASSERT_EQ(bc[r][i], send[1][i]) << r << " " << i;
    }
    for (size_t i = 0; i < count * n; ++i)
      ASSERT_EQ(ag[r][i], send[i / count][i % count]) << r << " " << i;
  }
}

// ----- hostile peer -------------------------------------------------------------------------
// Rank 1 does not run an engine: the test writes into rank 0's receive slots through rank 1's
// connection, exactly as a buggy or malicious peer could, then runs rank 0's allreduce.
class HostilePeer : public ::testing::Test {
 protected:
  // 512 KiB of floats: above the engine's one-round-exchange limit, so the ring runs and rank
  // 0's first receive is step 0, chunk 0: 1024 floats (4096-byte chunks) of block 0.
  static constexpr size_t kCount = 131072;
  static_assert(kCount * sizeof(float) > kExchangeMaxBytes);
  static constexpr uint32_t kFirstChunk = 1024;
  HostilePeer() : cluster(2, testConfig(2000)) {
    staging.assign(3 * 8192, 0);
    region = cluster.ranks[1].device().registerMemory(staging.data(), staging.size());
  }
  ~HostilePeer() override { region.reset(); }

  Link& peerLink() { return *cluster.ranks[1].links[0]; }

  // The header rank 0 expects first: collective #0, link sequence 0, step 0, chunk 0.
  format::ChunkHeader goodHeader() const {
    format::ChunkHeader h{};
    h.magic = format::kChunkMagic;
    h.version = format::kChunkVersion;
    h.codec = 0;
    h.dtype = static_cast<uint8_t>(DataType::kFloat32);
    h.collectiveId = 0;
    h.step = 0;
    h.sequence = 0;
    h.chunkIndex = 0;
    h.elementCount = kFirstChunk;
    h.payloadBytes = kFirstChunk * 4;
    h.elementOffset = 0;
    h.totalCount = kCount;
    h.collective = static_cast<uint8_t>(CollectiveKind::kAllReduce);
    h.reduceOp = static_cast<uint8_t>(ReduceOp::kSum);
    return h;
  }

  // Writes `bytes` bytes of staging into rank 0's slot area at slot `at`, announcing `immSlot`.
  void write(size_t bytes, size_t at, uint32_t immSlot, ImmTag tag = ImmTag::kData) {
    const transport::LocalSegment seg{region.get(), 0, bytes};
    const size_t nsegs = bytes ? 1 : 0;
    const auto r = peerLink().connection().postWrite(
        std::span<const transport::LocalSegment>(&seg, nsegs), peerLink().peerSlots,
        at * peerLink().layout().slotBytes(), makeImm(tag, immSlot), 99);
    ASSERT_EQ(r, transport::PostResult::kOk);
  }
  void writeHeader(const format::ChunkHeader& h, size_t payloadBytes, uint32_t slot = 0) {
    std::memcpy(staging.data(), &h, sizeof(h));
    for (size_t i = 0; i < payloadBytes; ++i)
      staging[64 + i] = static_cast<uint8_t>(i);
    write(64 + payloadBytes, slot, slot);
  }

  // Runs rank 0's allreduce and returns the error it threw (fails the test when none).
  Error runRank0(size_t count = kCount) {
    std::vector<float> send(count, 1.0f), recv(count, 0.0f);
    CollectiveArgs a;
    a.kind = CollectiveKind::kAllReduce;
    a.send = send.data();
    a.recv = recv.data();
    a.count = count;
    const auto start = std::chrono::steady_clock::now();
    try {
      cluster.ranks[0].engine->run(a);
    } catch (const Error& e) {
      elapsed = std::chrono::steady_clock::now() - start;
      return e;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw something other than gs::Error: " << e.what();
      return Error(Errc::kInternal, e.what());
    }
    ADD_FAILURE() << "rank 0's allreduce succeeded against a hostile peer";
    return Error(Errc::kOk, "");
  }

  void expectError(const Error& e, Errc code, const char* mentions) {
    EXPECT_EQ(e.code(), code) << errcName(e.code()) << ": " << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1"), std::string::npos) << "does not name rank 1: " << what;
    EXPECT_NE(what.find(mentions), std::string::npos)
        << "does not mention '" << mentions << "': " << what;
    // Rejected promptly, not by the 2 s timeout.
    EXPECT_LT(elapsed, std::chrono::milliseconds(1500)) << what;
  }

  Cluster cluster;
  std::vector<uint8_t> staging;
  std::unique_ptr<transport::MemoryRegion> region;
  std::chrono::steady_clock::duration elapsed{};
};

TEST_F(HostilePeer, Garbage) {
  for (size_t i = 0; i < 64 + 128; ++i)
    staging[i] = static_cast<uint8_t>(i * 37 + 11);
  write(64 + 128, 0, 0);
  expectError(runRank0(), Errc::kRemote, "magic");
}

TEST_F(HostilePeer, BadMagic) {
  auto h = goodHeader();
  h.magic = 0x4b435348;
  writeHeader(h, h.payloadBytes);
  expectError(runRank0(), Errc::kRemote, "magic");
}

TEST_F(HostilePeer, BadVersion) {
  auto h = goodHeader();
  h.version = 7;
  writeHeader(h, h.payloadBytes);
  expectError(runRank0(), Errc::kRemote, "version");
}

TEST_F(HostilePeer, ElementCountMismatch) {
  auto h = goodHeader();
  h.elementCount = kFirstChunk - 1;
  h.payloadBytes = (kFirstChunk - 1) * 4;
  writeHeader(h, h.payloadBytes);
  expectError(runRank0(), Errc::kRemote, "element count");
}

TEST_F(HostilePeer, TotalCountMismatchIsInvalidArgument) {
  auto h = goodHeader();
  h.totalCount = kCount + 1;
  writeHeader(h, h.payloadBytes);
  expectError(runRank0(), Errc::kInvalidArgument, "count");
}

TEST_F(HostilePeer, PayloadShorterThanTheHeaderSays) {
  auto h = goodHeader();
  writeHeader(h, h.payloadBytes - 4);
  expectError(runRank0(), Errc::kRemote, "length");
}

TEST_F(HostilePeer, ChunkShorterThanAHeader) {
  std::memset(staging.data(), 0, 64);
  write(10, 0, 0);
  expectError(runRank0(), Errc::kRemote, "header");
}

TEST_F(HostilePeer, SlotIndexOutOfRange) {
  auto h = goodHeader();
  std::memcpy(staging.data(), &h, sizeof(h));
  write(64 + h.payloadBytes, 0, 4);  // 4 slots: 0..3
  expectError(runRank0(), Errc::kRemote, "slot 4");
}

TEST_F(HostilePeer, SlotIndexFarOutOfRange) {
  write(0, 0, (1u << 30) - 1);
  expectError(runRank0(), Errc::kRemote, "slot");
}

TEST_F(HostilePeer, SameSlotTwice) {
  auto h = goodHeader();
  h.sequence = 1;  // belongs in slot 1; announced twice there
  std::memcpy(staging.data(), &h, sizeof(h));
  write(64 + h.payloadBytes, 1, 1);
  write(64 + h.payloadBytes, 1, 1);
  expectError(runRank0(), Errc::kRemote, "not free");
}

// The one-round exchange (2 ranks, <= 64 KiB): rank 0 receives the whole buffer in step 1.
TEST_F(HostilePeer, ExchangePathValidatesToo) {
  auto h = goodHeader();
  h.step = 1;
  h.totalCount = 64;
  h.elementCount = 63;  // one short of the 64 expected
  h.payloadBytes = 63 * 4;
  writeHeader(h, h.payloadBytes);
  expectError(runRank0(64), Errc::kRemote, "element count");
}

TEST_F(HostilePeer, ExchangePathBadMagic) {
  auto h = goodHeader();
  h.step = 1;
  h.totalCount = 64;
  h.elementCount = 64;
  h.payloadBytes = 64 * 4;
  h.magic = 0;
  writeHeader(h, h.payloadBytes);
  expectError(runRank0(64), Errc::kRemote, "magic");
}

TEST_F(HostilePeer, ExchangePathAcceptsAWellFormedChunk) {
  // Control for the two tests above: the same header, well formed, is accepted and rank 0
  // completes (in the exchange a well-formed chunk is all it needs from rank 1).
  auto h = goodHeader();
  h.step = 1;
  h.totalCount = 64;
  h.elementCount = 64;
  h.payloadBytes = 64 * 4;
  std::memcpy(staging.data(), &h, sizeof(h));
  for (int i = 0; i < 64; ++i) {
    const float v = 0.5f * static_cast<float>(i);
    std::memcpy(staging.data() + 64 + 4 * i, &v, 4);
  }
  write(64 + 256, 0, 0);
  std::vector<float> send(64, 1.0f), recv(64, 0.0f);
  CollectiveArgs a;
  a.send = send.data();
  a.recv = recv.data();
  a.count = 64;
  EXPECT_NO_THROW(cluster.ranks[0].engine->run(a));
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(recv[i], 1.0f + 0.5f * static_cast<float>(i)) << i;
}

TEST_F(HostilePeer, AbortNotice) {
  write(0, 0, 1, ImmTag::kAbort);
  expectError(runRank0(), Errc::kRemote, "failed");
}

TEST_F(HostilePeer, WriteOutsideTheSlotRegion) {
  // The transport rejects it and fails the connection; rank 0 must report the connection.
  const transport::LocalSegment seg{region.get(), 0, 128};
  const auto r = peerLink().connection().postWrite(
      std::span<const transport::LocalSegment>(&seg, 1), peerLink().peerSlots,
      peerLink().layout().regionBytes() - 64, makeImm(ImmTag::kData, 0), 1);
  EXPECT_EQ(r, transport::PostResult::kError);
  expectError(runRank0(), Errc::kRemote, "outside region");
}

TEST(EngineFuzz, CorruptedFirstChunkAlwaysFailsCleanly) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 12; ++iter) {
    Cluster cluster(2, testConfig(1000));
    std::vector<uint8_t> staging(64 + 4096);
    auto region = cluster.ranks[1].device().registerMemory(staging.data(), staging.size());
    format::ChunkHeader h{};
    h.magic = format::kChunkMagic;
    h.version = 1;
    h.dtype = 0;
    h.elementCount = 1024;  // ring path: step 0, chunk 0 of a 32768-float allreduce
    h.payloadBytes = 4096;
    h.totalCount = 32768;
    std::memcpy(staging.data(), &h, 64);
    // Flip a few random bits in the header fields that are validated (bytes 0..11, 16..57).
    for (int f = 0; f < 3; ++f) {
      size_t byte;
      do
        byte = rng() % 58;
      while (byte >= 12 && byte < 16);
      staging[byte] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    Link& peer = *cluster.ranks[1].links[0];
    const transport::LocalSegment seg{region.get(), 0, staging.size()};
    ASSERT_EQ(peer.connection().postWrite(std::span<const transport::LocalSegment>(&seg, 1),
                                          peer.peerSlots, 0, makeImm(ImmTag::kData, 0), 1),
              transport::PostResult::kOk);
    std::vector<float> send(32768, 1.0f), recv(32768);
    CollectiveArgs a;
    a.send = send.data();
    a.recv = recv.data();
    a.count = 32768;
    try {
      cluster.ranks[0].engine->run(a);
      ADD_FAILURE() << "accepted a corrupted chunk, iteration " << iter;
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == Errc::kRemote || e.code() == Errc::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    region.reset();
  }
}

TEST(EngineTimeout, SilentPeer) {
  Cluster cluster(2, testConfig(300));
  std::vector<float> send(64, 1.0f), recv(64);
  CollectiveArgs a;
  a.send = send.data();
  a.recv = recv.data();
  a.count = 64;
  const auto start = std::chrono::steady_clock::now();
  try {
    cluster.ranks[0].engine->run(a);
    FAIL() << "completed without the peer";
  } catch (const Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    EXPECT_EQ(e.code(), Errc::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    EXPECT_GE(ms, 290);
    EXPECT_LT(ms, 1500) << e.what();
  }
}

TEST(EngineAbort, AbortFlagStopsAWaitingCollective) {
  Cluster cluster(2, testConfig(5000));
  std::vector<float> send(64, 1.0f), recv(64);
  CollectiveArgs a;
  a.send = send.data();
  a.recv = recv.data();
  a.count = 64;
  std::thread trigger([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cluster.abortFlag = true;
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    cluster.ranks[0].engine->run(a);
    ADD_FAILURE() << "completed without the peer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kAborted) << e.what();
  }
  trigger.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2000));
  // The peer was told: its link received an abort notice naming rank 0.
  transport::Completion c[8];
  bool sawAbort = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (!sawAbort && std::chrono::steady_clock::now() < until) {
    const size_t got = cluster.ranks[1].links[0]->connection().poll(c);
    for (size_t i = 0; i < got; ++i) {
      sawAbort |= c[i].kind == transport::CompletionKind::kRemoteWrite &&
                  immTag(c[i].imm) == ImmTag::kAbort && (c[i].imm & kImmPayloadMask) == 0;
    }
  }
  EXPECT_TRUE(sawAbort);
}

}  // namespace
}  // namespace gs::stream
