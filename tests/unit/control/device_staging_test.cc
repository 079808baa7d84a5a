// Collectives on device buffers through pinned host staging (control/device_staging.h), run by
// real communicators (threads of this process, real rendezvous, tcp over 127.0.0.1) on
// FakeDeviceMemory: host memory the fake calls device memory, streams as delayed worker
// threads. The real CUDA path runs the same calls in tests/gpu on a GPU machine.
#include "control/device_staging.h"

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "staging_ranks.h"

namespace gs::control {
namespace {

using namespace staging_test;

TEST_F(FakeDeviceStaging, AllReduceOverManyPiecesInAndOutOfPlace) {
  constexpr int kRanks = 3;
  const size_t count = 100003;  // 7 pieces of 16384 floats, the last one short
  for (bool inPlace : {false, true}) {
    std::vector<std::vector<float>> results(kRanks);
    expectAllOk(runRanks(kRanks, fake_, {}, [&](int r, Communicator& comm) {
      Stream s = fake_->createStream();
      std::vector<float> in(count);
      for (size_t i = 0; i < count; ++i)
        in[i] = inputValue(r, i);
      void* send = fake_->allocDevice(count * 4);
      void* recv = inPlace ? send : fake_->allocDevice(count * 4);
      toDevice(*fake_, send, in, s);
      comm.run(argsOf(CollectiveKind::kAllReduce, send, recv, count), s);
      results[r] = fromDevice(*fake_, recv, count, s);
      // Inputs of an out-of-place call stay as they were.
      if (!inPlace) {
        EXPECT_EQ(fromDevice(*fake_, send, count, s), in);
      }
      const auto snap = comm.stats().snapshot;
      EXPECT_EQ(snap.stagedCollectives, 1u) << "one collective, however many pieces";
      EXPECT_EQ(snap.stagedToHostBytes, count * 4);
      EXPECT_EQ(snap.stagedToDeviceBytes, count * 4);
      EXPECT_LE(fake_->maxPinnedBytes(), size_t{2 * kRanks} * (64 << 10));
      fake_->freeDevice(send);
      if (!inPlace)
        fake_->freeDevice(recv);
    }));
    EXPECT_EQ(fake_->pinnedBytes(), 0u) << "the communicators freed their staging slots";
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(results[r].size(), count);
      for (size_t i = 0; i < count; ++i) {
        const float want = inputValue(0, i) + inputValue(1, i) + inputValue(2, i);
        ASSERT_EQ(results[r][i], want)
            << "rank " << r << " element " << i << " in place " << inPlace;
      }
    }
  }
}

TEST_F(FakeDeviceStaging, ReduceScatterAndAllGatherStageEveryBlocksRange) {
  constexpr int kRanks = 3;
  const size_t count = 9001;  // per block; 3 blocks of 5461 floats fit a 64 KiB slot: 2 pieces
  expectAllOk(runRanks(kRanks, fake_, {}, [&](int r, Communicator& comm) {
    Stream s = fake_->createStream();
    std::vector<float> in(count * kRanks);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = inputValue(r, i);
    void* send = fake_->allocDevice(in.size() * 4);
    void* block = fake_->allocDevice(count * 4);
    toDevice(*fake_, send, in, s);
    comm.run(argsOf(CollectiveKind::kReduceScatter, send, block, count), s);
    const auto reduced = fromDevice(*fake_, block, count, s);
    for (size_t i = 0; i < count; ++i) {
      const size_t at = static_cast<size_t>(r) * count + i;
      ASSERT_EQ(reduced[i], inputValue(0, at) + inputValue(1, at) + inputValue(2, at))
          << "rank " << r << " element " << i;
    }
    // Allgather of the reduced blocks, out of place and in place (send = own block of recv).
    void* all = fake_->allocDevice(in.size() * 4);
    comm.run(argsOf(CollectiveKind::kAllGather, block, all, count), s);
    auto* own = static_cast<uint8_t*>(send) + static_cast<size_t>(r) * count * 4;
    fake_->copy2D(own, 0, block, 0, count * 4, 1, s);
    comm.run(argsOf(CollectiveKind::kAllGather, own, send, count), s);
    for (void* gathered : {all, send}) {
      const auto got = fromDevice(*fake_, gathered, in.size(), s);
      for (size_t at = 0; at < got.size(); ++at) {
        ASSERT_EQ(got[at], inputValue(0, at) + inputValue(1, at) + inputValue(2, at))
            << "rank " << r << " element " << at;
      }
    }
    EXPECT_EQ(comm.stats().snapshot.stagedToDeviceBytes, (count + 2 * count * kRanks) * 4);
    fake_->freeDevice(send);
    fake_->freeDevice(block);
    fake_->freeDevice(all);
  }));
}

TEST_F(FakeDeviceStaging, BroadcastFromANonZeroRoot) {
  constexpr int kRanks = 3;
  const size_t count = 40000;
  expectAllOk(runRanks(kRanks, fake_, {}, [&](int r, Communicator& comm) {
    Stream s = fake_->createStream();
    void* buf = fake_->allocDevice(count * 4);
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i)
      mine[i] = inputValue(r, i);
    toDevice(*fake_, buf, mine, s);
    CollectiveArgs a = argsOf(CollectiveKind::kBroadcast, r == 1 ? buf : nullptr, buf, count);
    a.root = 1;
    comm.run(a, s);
    const auto got = fromDevice(*fake_, buf, count, s);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(got[i], inputValue(1, i)) << "rank " << r << " element " << i;
    // Only the root copies an input to the host.
    EXPECT_EQ(comm.stats().snapshot.stagedToHostBytes, r == 1 ? count * 4 : 0u);
    fake_->freeDevice(buf);
  }));
}

TEST_F(FakeDeviceStaging, LossyCodecLeavesReplicasBitIdentical) {
  constexpr int kRanks = 3;
  const size_t count = 50001;
  Options opt;
  opt.codec = "int8";
  std::vector<std::vector<float>> results(kRanks);
  expectAllOk(runRanks(kRanks, fake_, opt, [&](int r, Communicator& comm) {
    Stream s = fake_->createStream();
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i)
      in[i] = std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r));
    void* buf = fake_->allocDevice(count * 4);
    toDevice(*fake_, buf, in, s);
    comm.run(argsOf(CollectiveKind::kAllReduce, buf, buf, count), s);
    results[r] = fromDevice(*fake_, buf, count, s);
    fake_->freeDevice(buf);
  }));
  for (int r = 1; r < kRanks; ++r)
    ASSERT_EQ(memcmp(results[r].data(), results[0].data(), count * 4), 0) << "rank " << r;
  for (size_t i = 0; i < count; i += 997) {
    float want = 0;
    for (int r = 0; r < kRanks; ++r)
      want += std::sin(0.001f * static_cast<float>(i) + static_cast<float>(r));
    EXPECT_NEAR(results[0][i], want, 0.05) << "element " << i;
  }
}

TEST_F(FakeDeviceStaging, CallsOnTwoStreamsNeverOverwriteASlotEarly) {
  // Call 1 runs on a slow stream A: it returns with its result copies (slot -> x) still
  // pending. Call 2 on a fast stream B stages into the same slots; unless B is ordered after A's
  // copies, B's input copies overwrite the slots before A copied x's results out of them.
  constexpr int kRanks = 2;
  const size_t count = 30000;  // two pieces: both slots
  expectAllOk(runRanks(kRanks, fake_, {}, [&](int r, Communicator& comm) {
    Stream a = fake_->createStream(), b = fake_->createStream();
    void* x = fake_->allocDevice(count * 4);
    void* y = fake_->allocDevice(count * 4);
    std::vector<float> ones(count, 1.f + static_cast<float>(r)), tens(count, 10.f);
    toDevice(*fake_, x, ones, a);
    toDevice(*fake_, y, tens, b);
    fake_->setStreamDelay(a, std::chrono::milliseconds(15));
    comm.run(argsOf(CollectiveKind::kAllReduce, x, x, count), a);
    comm.run(argsOf(CollectiveKind::kAllReduce, y, y, count), b);
    fake_->setStreamDelay(a, std::chrono::microseconds(0));
    EXPECT_EQ(fromDevice(*fake_, x, count, a), std::vector<float>(count, 3.f));
    EXPECT_EQ(fromDevice(*fake_, y, count, b), std::vector<float>(count, 20.f));
    fake_->freeDevice(x);
    fake_->freeDevice(y);
  }));
}

TEST_F(FakeDeviceStaging, HostBuffersWithAStreamWaitForItsProducers) {
  constexpr int kRanks = 2;
  const size_t count = 1000;
  expectAllOk(runRanks(kRanks, fake_, {}, [&](int r, Communicator& comm) {
    Stream s = fake_->createStream();
    std::vector<float> buf(count, 0.f);
    // A "kernel" on the stream writes the host buffer 20 ms from now.
    fake_->enqueue(s, [&buf, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::fill(buf.begin(), buf.end(), 1.f + static_cast<float>(r));
    });
    comm.run(argsOf(CollectiveKind::kAllReduce, buf.data(), buf.data(), count), s);
    EXPECT_EQ(buf, std::vector<float>(count, 3.f));
    EXPECT_EQ(comm.stats().snapshot.stagedCollectives, 0u) << "host buffers are not staged";
  }));
}

TEST_F(FakeDeviceStaging, AStreamThatNeverGetsThereTimesOutOnEveryRank) {
  constexpr int kRanks = 2;
  Options opt;
  opt.timeoutMs = 600;
  const auto start = std::chrono::steady_clock::now();
  auto errors = runRanks(kRanks, fake_, opt, [&](int r, Communicator& comm) {
    HeldStream held(*fake_, r == 0);  // rank 0: a kernel still running at the timeout
    comm.run(argsOf(CollectiveKind::kAllReduce, held.buffer, held.buffer, 1024), held.stream);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(errors[0].find("CUDA stream did not complete"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0"), std::string::npos)
      << "the peer fails too, naming rank 0, instead of waiting forever: " << errors[1];
  EXPECT_LT(seconds, 10.0);
}

TEST_F(FakeDeviceStaging, AbortWhileWaitingForTheStreamReturns) {
  auto errors = runRanks(1, fake_, {}, [&](int, Communicator& comm) {
    HeldStream held(*fake_);
    std::jthread aborter([&] {  // joined before held releases the stream
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comm.abort();
    });
    comm.run(argsOf(CollectiveKind::kAllReduce, held.buffer, held.buffer, 1024), held.stream);
  });
  EXPECT_NE(errors[0].find("aborted"), std::string::npos) << errors[0];
}

TEST_F(FakeDeviceStaging, BadDeviceBuffersAreRefusedByName) {
  auto errors = runRanks(1, fake_, {}, [&](int, Communicator& comm) {
    void* a = fake_->allocDevice(4096, 0);
    void* b = fake_->allocDevice(4096, 1);
    try {
      comm.run(argsOf(CollectiveKind::kAllReduce, a, b, 1024), nullptr);
      ADD_FAILURE() << "buffers on two devices were accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("device 0 and recvbuff on device 1"), std::string::npos)
          << e.what();
    }
    try {
      comm.submit(argsOf(CollectiveKind::kAllReduce, a, b, 1024));
      ADD_FAILURE() << "a non-blocking call took buffers on two devices";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("device 0 and recvbuff on device 1"), std::string::npos)
          << e.what();
    }
    // Neither refusal broke the communicator: a good call still runs (on the default stream).
    comm.run(argsOf(CollectiveKind::kAllReduce, a, a, 1024), nullptr);
    fake_->synchronize(nullptr);
    fake_->freeDevice(a);
    fake_->freeDevice(b);
  });
  expectAllOk(errors);
}

}  // namespace
}  // namespace gs::control
