// Non-blocking collectives and gradient streams on device buffers (Communicator::submit with a
// CUDA stream, GradientStream over device memory), run by real communicators (threads, real
// rendezvous, tcp over 127.0.0.1) on FakeDeviceMemory: host memory the fake calls device
// memory, streams as delayed worker threads. The real CUDA path runs in tests/gpu.
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "control/gradient_stream.h"
#include "staging_ranks.h"

namespace gs::control {
namespace {

using namespace staging_test;

class FakeDeviceRequests : public FakeDeviceStaging {};

// A "kernel" on stream s that writes values into buf (device or host memory) after a delay:
// whatever reads buf without waiting for the stream sees what was there before.
void produceLater(FakeDeviceMemory& fake, Stream s, void* buf, std::vector<float> values) {
  fake.enqueue(s, [buf, values = std::move(values)] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    memcpy(buf, values.data(), values.size() * sizeof(float));
  });
}

// The request reads what the stream's earlier work wrote, does not wait for the stream's later
// work (the copies run on the communicator's own stream), and completes with the results
// already in the buffer. Device buffers (many pieces) and host buffers alike.
TEST_F(FakeDeviceRequests, RequestReadsWhatTheStreamWroteBeforeTheCall) {
  constexpr int kRanks = 3;
  const size_t count = 100003;
  for (bool onDevice : {true, false}) {
    std::vector<std::vector<float>> results(kRanks);
    expectAllOk(runRanks(kRanks, fake_, {}, [&](int r, Communicator& comm) {
      std::vector<float> in(count), host(count, 0.f);  // outlive the producer's kernels
      HeldStream producer(*fake_, /*hold=*/false);
      for (size_t i = 0; i < count; ++i)
        in[i] = inputValue(r, i);
      void* buf = onDevice ? fake_->allocDevice(count * 4) : host.data();
      produceLater(*fake_, producer.stream, buf, in);
      auto request =
          comm.submit(argsOf(CollectiveKind::kAllReduce, buf, buf, count), producer.stream);
      // Work the caller enqueues later (the next layer's kernels) holds the stream: the
      // request must not wait for it.
      fake_->enqueue(producer.stream, [&producer] {
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!producer.release.load() && std::chrono::steady_clock::now() < end)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
      const bool done = request->waitUntil(Deadline::afterMs(15000));
      producer.release = true;
      ASSERT_TRUE(done) << "the request waited for work enqueued after it";
      ASSERT_EQ(request->status(), Errc::kOk) << request->message();
      // Complete means the results are in the buffer: read it without synchronizing.
      results[r].assign(static_cast<float*>(buf), static_cast<float*>(buf) + count);
      EXPECT_EQ(comm.stats().snapshot.stagedCollectives, onDevice ? 1u : 0u);
      fake_->synchronize(producer.stream);
      if (onDevice)
        fake_->freeDevice(buf);
    }));
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(results[r][i], inputValue(0, i) + inputValue(1, i) + inputValue(2, i))
            << "rank " << r << " element " << i << (onDevice ? " device" : " host");
      }
    }
  }
  // Each communicator made one stream of its own (device run) and destroyed it; the tests'
  // producers (one per rank and run) live on.
  EXPECT_EQ(fake_->streamsCreated() - fake_->streamsDestroyed(), 2 * kRanks);
}

// A gradient stream over a device buffer, with a lossy codec and error feedback, ends every
// iteration with the same bits (and the same residual) as one over a host buffer holding the
// same gradients; so does one over a host buffer the producer stream writes. The device
// stream's buckets are three staging pieces each; the host streams' buckets are those pieces,
// so all run the same collectives on the same values.
TEST_F(FakeDeviceRequests, GradientStreamOnDeviceMatchesHostBitForBitWithErrorFeedback) {
  constexpr int kRanks = 2;
  constexpr int kIterations = 3;
  const size_t count = 100000;
  const size_t piece = 16384;  // floats in a 64 KiB staging slot
  expectAllOk(runRanks(kRanks, fake_, {}, [&](int r, Communicator& comm) {
    std::vector<float> host(count), streamedHost(count);  // outlive the producer's kernels
    HeldStream producer(*fake_, /*hold=*/false);
    void* dev = fake_->allocDevice(count * 4);
    GradientStreamConfig cfg;
    cfg.codec = "int8";
    cfg.errorFeedback = true;
    cfg.bucketBytes = piece * 4;
    GradientStream onHost(comm, host.data(), count, DataType::kFloat32, ReduceOp::kSum, cfg);
    cfg.cudaStream = producer.stream;
    GradientStream onStreamedHost(comm, streamedHost.data(), count, DataType::kFloat32,
                                  ReduceOp::kSum, cfg);
    cfg.bucketBytes = 3 * piece * 4;
    GradientStream onDevice(comm, dev, count, DataType::kFloat32, ReduceOp::kSum, cfg);
    // The backward pass: kernels on the producer stream write the gradients; ranges are marked
    // ready as soon as their kernels are enqueued, in a rank-dependent order.
    auto backward = [&](GradientStream& stream, void* buf, const std::vector<float>& g) {
      stream.begin();
      const size_t half = count / 2;
      produceLater(*fake_, producer.stream, static_cast<float*>(buf) + half,
                   {g.begin() + half, g.end()});
      produceLater(*fake_, producer.stream, buf, {g.begin(), g.begin() + half});
      if (r == 0) {
        stream.ready(half, count - half);
        stream.ready(0, half);
      } else {
        stream.ready(0, half);
        stream.ready(half, count - half);
      }
      stream.wait(15000);
    };
    for (int iter = 0; iter < kIterations; ++iter) {
      std::vector<float> g(count);
      for (size_t i = 0; i < count; ++i)
        g[i] = gradient(r, i, iter);
      host = g;
      onHost.begin();
      onHost.ready(0, count);
      onHost.wait(15000);
      backward(onDevice, dev, g);
      ASSERT_EQ(memcmp(dev, host.data(), count * 4), 0) << "rank " << r << " iteration " << iter;
      backward(onStreamedHost, streamedHost.data(), g);
      ASSERT_EQ(streamedHost, host) << "rank " << r << " iteration " << iter;
    }
    ASSERT_EQ(onDevice.residualBytes(), count * 4);
    std::vector<float> hostResidual(count), deviceResidual(count), streamedResidual(count);
    onHost.saveResidual(hostResidual.data(), count * 4);
    onDevice.saveResidual(deviceResidual.data(), count * 4);
    onStreamedHost.saveResidual(streamedResidual.data(), count * 4);
    EXPECT_EQ(hostResidual, deviceResidual);
    EXPECT_EQ(hostResidual, streamedResidual);
    size_t nonzero = 0;
    for (float v : deviceResidual)
      nonzero += v != 0.f;
    EXPECT_GT(nonzero, count / 2) << "int8 drops something from most elements";
    // Sanity: the reduced values are the sums, within int8's error.
    for (size_t i = 0; i < count; i += 991) {
      const float want = gradient(0, i, kIterations - 1) + gradient(1, i, kIterations - 1);
      EXPECT_NEAR(host[i], want, 0.05f) << "element " << i;
    }
    fake_->synchronize(producer.stream);
    fake_->freeDevice(dev);
  }));
}

TEST_F(FakeDeviceRequests, AStreamThatNeverGetsThereFailsTheRequestOnEveryRank) {
  constexpr int kRanks = 2;
  Options opt;
  opt.timeoutMs = 600;
  std::vector<std::string> requestErrors(kRanks);
  // The failed request's copies still wait on the communicator's stream for the held one: the
  // buffers outlive the communicators, whose destruction waits for those copies.
  std::vector<void*> buffers;
  for (int r = 0; r < kRanks; ++r)
    buffers.push_back(fake_->allocDevice(4096));
  const auto start = std::chrono::steady_clock::now();
  expectAllOk(runRanks(kRanks, fake_, opt, [&](int r, Communicator& comm) {
    HeldStream held(*fake_, r == 0);  // rank 0: a kernel still running at the timeout
    auto request =
        comm.submit(argsOf(CollectiveKind::kAllReduce, buffers[r], buffers[r], 1024), held.stream);
    ASSERT_TRUE(request->waitUntil(Deadline::afterMs(10000))) << "the request never completed";
    requestErrors[r] = request->message();
    EXPECT_NE(request->status(), Errc::kOk);
  }));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (void* b : buffers)
    fake_->freeDevice(b);
  EXPECT_NE(requestErrors[0].find("CUDA stream did not complete"), std::string::npos)
      << requestErrors[0];
  EXPECT_NE(requestErrors[1].find("rank 0"), std::string::npos)
      << "the peer fails too, naming rank 0, instead of waiting forever: " << requestErrors[1];
  EXPECT_LT(seconds, 10.0);
}

}  // namespace
}  // namespace gs::control
