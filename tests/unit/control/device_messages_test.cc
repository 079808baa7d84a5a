// Point-to-point messages on device buffers (Communicator::run / submit of kPointToPoint with
// device memory or a CUDA stream: control/message_staging.h), run by real communicators
// (threads, real rendezvous, tcp over 127.0.0.1 or shm) on FakeDeviceMemory: host memory the
// fake calls device memory, streams as delayed worker threads. The real CUDA path runs in
// tests/gpu.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "staging_ranks.h"

namespace gs::control {
namespace {

using namespace staging_test;

class FakeDeviceMessages : public FakeDeviceStaging {};

CollectiveArgs message(bool sending, void* buffer, size_t count, int peer) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kPointToPoint;
  a.sending = sending;
  a.send = sending ? buffer : nullptr;
  a.recv = sending ? nullptr : buffer;
  a.count = count;
  a.dtype = DataType::kFloat32;
  a.op = ReduceOp::kSum;
  a.peer = peer;
  return a;
}

std::vector<float> inputs(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = inputValue(rank, i);
  return v;
}

// A "kernel" on stream s that writes values into buf after a delay: whatever reads buf without
// waiting for the stream sees what was there before.
void produceLater(FakeDeviceMemory& fake, Stream s, void* buf, std::vector<float> values) {
  fake.enqueue(s, [buf, values = std::move(values)] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    memcpy(buf, values.data(), values.size() * sizeof(float));
  });
}

Options over(const std::string& transport) {
  Options opt;
  opt.shm = transport == "shm";
  return opt;
}

// gs_send / gs_recv: rank 0 sends to rank 1, device or host memory on either side, over tcp
// and shm; the receiver reads exactly the sender's values, through the stream it passed.
TEST_F(FakeDeviceMessages, BlockingSendRecvBetweenDeviceAndHostBuffers) {
  const size_t count = 100003;  // many chunks of 16 KiB
  struct Case {
    bool sendOnDevice, recvOnDevice;
  };
  for (const std::string transport : {"tcp", "shm"}) {
    for (const Case c : {Case{true, true}, Case{true, false}, Case{false, true}}) {
      SCOPED_TRACE(transport + (c.sendOnDevice ? " device" : " host") + " -> " +
                   (c.recvOnDevice ? "device" : "host"));
      std::vector<float> received;
      expectAllOk(runRanks(2, fake_, over(transport), [&](int r, Communicator& comm) {
        EXPECT_EQ(comm.transportName(), transport);
        Stream s = fake_->createStream();
        std::vector<float> host = r == 0 ? inputs(0, count) : std::vector<float>(count, -1.f);
        const bool onDevice = r == 0 ? c.sendOnDevice : c.recvOnDevice;
        void* buf = onDevice ? fake_->allocDevice(count * 4) : host.data();
        if (r == 0) {
          if (onDevice)
            toDevice(*fake_, buf, host, s);
          comm.run(message(true, buf, count, 1), s);
        } else {
          comm.run(message(false, buf, count, 0), s);
          received = onDevice ? fromDevice(*fake_, buf, count, s) : host;
          const auto snap = comm.stats().snapshot;
          EXPECT_EQ(snap.stagedToDeviceBytes, onDevice ? count * 4 : 0u);
        }
        if (r == 0) {
          EXPECT_EQ(comm.stats().snapshot.stagedToHostBytes, onDevice ? count * 4 : 0u);
        }
        fake_->synchronize(s);
        if (onDevice)
          fake_->freeDevice(buf);
      }));
      ASSERT_EQ(received, inputs(0, count));
      EXPECT_EQ(fake_->pinnedBytes(), 0u) << "the communicators freed their staging buffers";
    }
  }
}

// gs_isend + gs_irecv both posted by both ranks before either waits (an exchange), device
// buffers, with the requests completing once the data is in device memory.
TEST_F(FakeDeviceMessages, ExchangePostedFirstThenWaited) {
  const size_t count = 50001;
  std::vector<std::vector<float>> received(2);
  for (const std::string transport : {"tcp", "shm"}) {
    SCOPED_TRACE(transport);
    expectAllOk(runRanks(2, fake_, over(transport), [&](int r, Communicator& comm) {
      Stream s = fake_->createStream();
      void* send = fake_->allocDevice(count * 4);
      void* recv = fake_->allocDevice(count * 4);
      const std::vector<float> mine = inputs(r, count);  // outlives the copy
      toDevice(*fake_, send, mine, s);
      auto isend = comm.submit(message(true, send, count, 1 - r), s);
      auto irecv = comm.submit(message(false, recv, count, 1 - r), s);
      ASSERT_TRUE(comm.wait(isend, Deadline::afterMs(15000)));
      ASSERT_TRUE(comm.wait(irecv, Deadline::afterMs(15000)));
      ASSERT_EQ(isend->status(), Errc::kOk) << isend->message();
      ASSERT_EQ(irecv->status(), Errc::kOk) << irecv->message();
      // Complete means in device memory: read it without the stream.
      received[r].assign(static_cast<float*>(recv), static_cast<float*>(recv) + count);
      fake_->synchronize(s);
      fake_->freeDevice(send);
      fake_->freeDevice(recv);
    }));
    EXPECT_EQ(received[0], inputs(1, count));
    EXPECT_EQ(received[1], inputs(0, count));
  }
}

// Stream order on both ends: the sender's kernel writes the buffer just before gs_send on its
// stream (the new values travel, not the old ones), and a copy the receiver enqueues on its
// stream after gs_irecv completes reads the received values.
TEST_F(FakeDeviceMessages, SendAndReceiveFollowTheStreamOrder) {
  const size_t count = 40000;
  std::vector<float> received, receivedAsync;
  expectAllOk(runRanks(2, fake_, {}, [&](int r, Communicator& comm) {
    Stream s = fake_->createStream();
    void* buf = fake_->allocDevice(count * 4);
    if (r == 0) {
      const std::vector<float> old(count, 7.f);
      toDevice(*fake_, buf, old, s);
      fake_->synchronize(s);
      produceLater(*fake_, s, buf, inputs(0, count));  // still running at the call
      comm.run(message(true, buf, count, 1), s);
      produceLater(*fake_, s, buf, inputs(2, count));
      auto request = comm.submit(message(true, buf, count, 1), s);
      ASSERT_TRUE(comm.wait(request, Deadline::afterMs(15000)));
      ASSERT_EQ(request->status(), Errc::kOk) << request->message();
    } else {
      comm.run(message(false, buf, count, 0), s);
      received = fromDevice(*fake_, buf, count, s);
      auto request = comm.submit(message(false, buf, count, 0), s);
      ASSERT_TRUE(comm.wait(request, Deadline::afterMs(15000)));
      ASSERT_EQ(request->status(), Errc::kOk) << request->message();
      receivedAsync = fromDevice(*fake_, buf, count, s);
    }
    fake_->synchronize(s);
    fake_->freeDevice(buf);
  }));
  EXPECT_EQ(received, inputs(0, count)) << "the send read the buffer before the stream wrote it";
  EXPECT_EQ(receivedAsync, inputs(2, count));
}

// A receive whose count differs from the send's fails on both ranks, and nothing reaches the
// device buffer.
TEST_F(FakeDeviceMessages, CountMismatchFailsBothRanksAndLeavesTheDeviceBufferAlone) {
  const size_t count = 20000;
  Options opt;
  opt.timeoutMs = 5000;
  std::vector<uint8_t> after(count * 4 + 20);
  std::vector<std::string> errors = runRanks(2, fake_, opt, [&](int r, Communicator& comm) {
    Stream s = fake_->createStream();
    const size_t n = r == 0 ? count : count + 5;
    void* buf = fake_->allocDevice(n * 4);  // 0xAB bytes
    // Outlives the copy the stream runs later (destroyed after `release` synchronizes it).
    const std::vector<float> in = inputs(0, count);
    if (r == 0)
      toDevice(*fake_, buf, in, s);
    struct Free {
      FakeDeviceMemory& fake;
      Stream s;
      void* buf;
      size_t bytes;
      std::vector<uint8_t>* copy;
      ~Free() {
        fake.synchronize(s);
        if (copy != nullptr)
          memcpy(copy->data(), buf, bytes);
        fake.freeDevice(buf);
      }
    } release{*fake_, s, buf, n * 4, r == 1 ? &after : nullptr};
    comm.run(message(r == 0, buf, n, 1 - r), s);
  });
  EXPECT_NE(errors[0].find("message sizes differ"), std::string::npos)
      << "the sender learns of the mismatch: " << errors[0];
  EXPECT_NE(errors[1].find("message sizes differ"), std::string::npos)
      << "the receiver refuses the message: " << errors[1];
  for (size_t i = 0; i < after.size(); ++i)
    ASSERT_EQ(after[i], 0xAB) << "byte " << i << " of the device buffer was written";
}

// Many messages reuse the same pinned buffers: pinned memory stays at a few buffers however
// many messages go, and the communicators free it when destroyed.
TEST_F(FakeDeviceMessages, PinnedBuffersAreReusedAcrossMessagesAndFreedAtDestroy) {
  const size_t count = 16384;  // 64 KiB
  constexpr int kMessages = 200;
  expectAllOk(runRanks(2, fake_, {}, [&](int r, Communicator& comm) {
    Stream s = fake_->createStream();
    void* buf = fake_->allocDevice(count * 4);
    for (int m = 0; m < kMessages; ++m) {
      const bool sending = (m % 2 == 0) == (r == 0);
      const std::vector<float> values(count, static_cast<float>(m));  // outlives the copy
      if (sending)
        toDevice(*fake_, buf, values, s);
      comm.run(message(sending, buf, count, 1 - r), s);
      if (!sending && m % 37 == 0) {
        EXPECT_EQ(fromDevice(*fake_, buf, count, s), std::vector<float>(count, m)) << m;
      }
    }
    const auto snap = comm.stats().snapshot;
    EXPECT_EQ(snap.stagedToHostBytes, kMessages / 2 * count * 4);
    EXPECT_EQ(snap.stagedToDeviceBytes, kMessages / 2 * count * 4);
    fake_->synchronize(s);
    fake_->freeDevice(buf);
  }));
  EXPECT_LE(fake_->maxPinnedBytes(), size_t{4} * count * 4) << "a buffer or two per rank";
  EXPECT_EQ(fake_->pinnedBytes(), 0u);
}

// A device send whose stream never gets to the call's mark fails within the timeout on both
// ranks instead of hanging.
TEST_F(FakeDeviceMessages, AStreamThatNeverGetsThereFailsTheMessageOnBothRanks) {
  Options opt;
  opt.timeoutMs = 600;
  std::vector<void*> buffers;
  for (int r = 0; r < 2; ++r)
    buffers.push_back(fake_->allocDevice(4096));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors = runRanks(2, fake_, opt, [&](int r, Communicator& comm) {
    HeldStream held(*fake_, r == 0);
    comm.run(message(r == 0, buffers[r], 1024, 1 - r), held.stream);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (void* b : buffers)
    fake_->freeDevice(b);
  EXPECT_NE(errors[0].find("rank 1"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("CUDA stream did not complete"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1], "");
  EXPECT_LT(seconds, 10.0);
}

}  // namespace
}  // namespace gs::control
