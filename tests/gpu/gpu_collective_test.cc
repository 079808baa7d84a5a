// Collectives on CUDA device buffers through the public C API (label gpu): ranks as threads
// sharing the one GPU, a real rendezvous on 127.0.0.1, shm and tcp links. Every call stages its
// buffers through pinned host memory on the rank's own stream (control/device_staging.h); the
// test reads results back with copies on that stream, so it checks the stream order the C API
// documents as well as the values. Skips, saying why, where no CUDA device is usable.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/cuda_assert.h"
#include "gradstream/gradstream.h"
#include "unit/capi/rank_threads.h"
#include "unit/control/staging_inputs.h"

namespace gs::testing {
namespace {

const char* noDeviceReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return cudaGetErrorString(e);
  return n > 0 ? nullptr : "no CUDA device";
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess)
      p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  float* f() const { return static_cast<float*>(p); }
};

class GpuCollective : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (const char* why = noDeviceReason())
      GTEST_SKIP() << "no CUDA device: " << why;
    // Small slots: every call below runs in several pieces (both slots, strided copies).
    setenv("GS_STAGING_BYTES", "256K", 1);
  }
  void TearDown() override { unsetenv("GS_STAGING_BYTES"); }
  RankOptions options() const {
    RankOptions opt;
    opt.transport = GetParam();
    return opt;
  }
};

TEST_P(GpuCollective, AllReduceInAndOutOfPlaceOnTheCallersStream) {
  constexpr int kRanks = 2;
  const size_t count = 300007;  // 5 pieces of 64 Ki floats, the last one short
  runRanks(kRanks, options(), [&](int r, gs_comm_t comm) {
    cudaStream_t s;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i)
      in[i] = inputValue(r, i);
    DeviceBuffer send(count * 4), recv(count * 4);
    ASSERT_NE(send.p, nullptr);
    ASSERT_NE(recv.p, nullptr);
    for (bool inPlace : {false, true}) {
      void* dst = inPlace ? send.p : recv.p;
      ASSERT_CUDA(cudaMemcpyAsync(send.p, in.data(), count * 4, cudaMemcpyHostToDevice, s));
      ASSERT_CUDA(cudaMemsetAsync(recv.p, 0xff, count * 4, s));  // poison: NaN
      ASSERT_EQ(gs_allreduce(send.p, dst, count, GS_FLOAT32, GS_SUM, comm,
                             reinterpret_cast<CUstream_st*>(s)),
                GS_OK)
          << gs_last_error();
      ASSERT_CUDA(cudaMemcpyAsync(out.data(), dst, count * 4, cudaMemcpyDeviceToHost, s));
      ASSERT_CUDA(cudaStreamSynchronize(s));
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], inputValue(0, i) + inputValue(1, i))
            << "rank " << r << " element " << i << " in place " << inPlace;
      }
    }
    gs_comm_stats_t st;
    memset(&st, 0, sizeof(st));
    st.struct_size = sizeof(st);
    ASSERT_EQ(gs_comm_stats(comm, &st), GS_OK);
    EXPECT_STREQ(st.device_path, "pinned_host_staging");
    EXPECT_EQ(st.staged_collectives, 2u);
    EXPECT_EQ(st.staged_to_host_bytes, 2 * count * 4);
    cudaStreamDestroy(s);
  });
}

TEST_P(GpuCollective, ReduceScatterAllGatherBroadcast) {
  constexpr int kRanks = 2;
  const size_t count = 70001;  // per block
  runRanks(kRanks, options(), [&](int r, gs_comm_t comm) {
    cudaStream_t s;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t total = count * kRanks;
    std::vector<float> in(total), out(total);
    for (size_t i = 0; i < total; ++i)
      in[i] = inputValue(r, i);
    DeviceBuffer blocks(total * 4), block(count * 4), all(total * 4);
    ASSERT_CUDA(cudaMemcpyAsync(blocks.p, in.data(), total * 4, cudaMemcpyHostToDevice, s));
    ASSERT_EQ(gs_reduce_scatter(blocks.p, block.p, count, GS_FLOAT32, GS_SUM, comm,
                                reinterpret_cast<CUstream_st*>(s)),
              GS_OK)
        << gs_last_error();
    ASSERT_EQ(
        gs_allgather(block.p, all.p, count, GS_FLOAT32, comm, reinterpret_cast<CUstream_st*>(s)),
        GS_OK)
        << gs_last_error();
    ASSERT_CUDA(cudaMemcpyAsync(out.data(), all.p, total * 4, cudaMemcpyDeviceToHost, s));
    ASSERT_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < total; ++i)
      ASSERT_EQ(out[i], inputValue(0, i) + inputValue(1, i)) << "rank " << r << " element " << i;
    // Broadcast from rank 1 in place.
    ASSERT_CUDA(cudaMemcpyAsync(all.p, in.data(), total * 4, cudaMemcpyHostToDevice, s));
    ASSERT_EQ(
        gs_broadcast(all.p, all.p, total, GS_FLOAT32, 1, comm, reinterpret_cast<CUstream_st*>(s)),
        GS_OK)
        << gs_last_error();
    ASSERT_CUDA(cudaMemcpyAsync(out.data(), all.p, total * 4, cudaMemcpyDeviceToHost, s));
    ASSERT_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < total; ++i)
      ASSERT_EQ(out[i], inputValue(1, i)) << "rank " << r << " element " << i;
    cudaStreamDestroy(s);
  });
}

void CUDART_CB sleepOnStream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

TEST_P(GpuCollective, InputsWrittenLaterOnTheStreamAreWhatIsReduced) {
  // The input is written by stream work that runs 50 ms after the call was made: the
  // collective must read it after that work, not what the buffer held when it was called.
  constexpr int kRanks = 2;
  const size_t count = 100000;
  runRanks(kRanks, options(), [&](int r, gs_comm_t comm) {
    cudaStream_t s;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DeviceBuffer buf(count * 4);
    std::vector<float> in(count, 1.f + static_cast<float>(r)), out(count);
    ASSERT_CUDA(cudaMemset(buf.p, 0, count * 4));
    static int ms = 50;
    ASSERT_CUDA(cudaLaunchHostFunc(s, sleepOnStream, &ms));
    ASSERT_CUDA(cudaMemcpyAsync(buf.p, in.data(), count * 4, cudaMemcpyHostToDevice, s));
    int before = -1, after = -1;
    ASSERT_CUDA(cudaGetDevice(&before));
    ASSERT_EQ(gs_allreduce(buf.p, buf.p, count, GS_FLOAT32, GS_SUM, comm,
                           reinterpret_cast<CUstream_st*>(s)),
              GS_OK)
        << gs_last_error();
    ASSERT_CUDA(cudaGetDevice(&after));
    EXPECT_EQ(before, after) << "the call left the caller's current device as it was";
    ASSERT_CUDA(cudaMemcpyAsync(out.data(), buf.p, count * 4, cudaMemcpyDeviceToHost, s));
    ASSERT_CUDA(cudaStreamSynchronize(s));
    EXPECT_EQ(out, std::vector<float>(count, 3.f));
    cudaStreamDestroy(s);
  });
}

TEST_P(GpuCollective, HostBuffersWithAStreamWaitForIt) {
  constexpr int kRanks = 2;
  const size_t count = 4096;
  runRanks(kRanks, options(), [&](int r, gs_comm_t comm) {
    cudaStream_t s;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* pinned = nullptr;
    ASSERT_CUDA(cudaMallocHost(&pinned, count * 4));
    std::fill(pinned, pinned + count, 0.f);
    std::vector<float> in(count, 2.f * static_cast<float>(r + 1));
    // Pinned host buffer filled by a copy on the stream after a 30 ms host function.
    static int ms = 30;
    DeviceBuffer src(count * 4);
    ASSERT_CUDA(cudaMemcpy(src.p, in.data(), count * 4, cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaLaunchHostFunc(s, sleepOnStream, &ms));
    ASSERT_CUDA(cudaMemcpyAsync(pinned, src.p, count * 4, cudaMemcpyDeviceToHost, s));
    ASSERT_EQ(gs_allreduce(pinned, pinned, count, GS_FLOAT32, GS_SUM, comm,
                           reinterpret_cast<CUstream_st*>(s)),
              GS_OK)
        << gs_last_error();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(pinned[i], 6.f) << "rank " << r << " element " << i;
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
  });
}

TEST_P(GpuCollective, NonBlockingAllReduceOnDeviceBuffersKeepsTheIssuingStreamsOrder) {
  // The input is written on the stream 50 ms after gs_iallreduce is called; then the stream is
  // held for 3 s more. The request must reduce the written input and complete without waiting
  // for the later work (its copies run on the communicator's own stream), with the results in
  // the buffer when gs_wait returns.
  constexpr int kRanks = 2;
  const size_t count = 300007;
  runRanks(kRanks, options(), [&](int r, gs_comm_t comm) {
    cudaStream_t s;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DeviceBuffer buf(count * 4);
    ASSERT_NE(buf.p, nullptr);
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i)
      in[i] = inputValue(r, i);
    ASSERT_CUDA(cudaMemset(buf.p, 0, count * 4));
    static int shortMs = 50, longMs = 3000;
    ASSERT_CUDA(cudaLaunchHostFunc(s, sleepOnStream, &shortMs));
    ASSERT_CUDA(cudaMemcpyAsync(buf.p, in.data(), count * 4, cudaMemcpyHostToDevice, s));
    gs_request_t req = nullptr;
    ASSERT_EQ(gs_iallreduce(buf.p, buf.p, count, GS_FLOAT32, GS_SUM, comm,
                            reinterpret_cast<CUstream_st*>(s), &req),
              GS_OK)
        << gs_last_error();
    ASSERT_CUDA(cudaLaunchHostFunc(s, sleepOnStream, &longMs));
    EXPECT_EQ(gs_wait(req, 2000), GS_OK) << gs_last_error();
    // A copy on another stream sees the results once the request is complete.
    cudaStream_t reader;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
    ASSERT_CUDA(cudaMemcpyAsync(out.data(), buf.p, count * 4, cudaMemcpyDeviceToHost, reader));
    ASSERT_CUDA(cudaStreamSynchronize(reader));
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[i], inputValue(0, i) + inputValue(1, i)) << "rank " << r << " element " << i;
    EXPECT_EQ(gs_request_free(req), GS_OK);
    ASSERT_CUDA(cudaStreamSynchronize(s));
    cudaStreamDestroy(reader);
    cudaStreamDestroy(s);
  });
}

TEST_P(GpuCollective, GradientStreamOnADeviceBufferMatchesAHostOneWithErrorFeedback) {
  // The same gradients through a gradient stream over a device buffer (written by copies on
  // the producing stream, buckets of three staging pieces) and one over a host buffer (buckets
  // of one piece): int8 with error feedback, three iterations, identical bits and residuals.
  constexpr int kRanks = 2;
  constexpr int kIterations = 3;
  const size_t count = 300000;
  const size_t piece = 65536;  // floats in a 256 KiB staging slot
  runRanks(kRanks, options(), [&](int r, gs_comm_t comm) {
    cudaStream_t s;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DeviceBuffer dev(count * 4);
    ASSERT_NE(dev.p, nullptr);
    std::vector<float> host(count), g(count), out(count);
    gs_stream_config_t cfg;
    gs_stream_config_init(&cfg);
    cfg.codec = "int8";
    cfg.error_feedback = 1;
    cfg.bucket_bytes = static_cast<int64_t>(piece * 4);
    gs_stream_t onHost = nullptr, onDevice = nullptr;
    ASSERT_EQ(gs_stream_open(comm, host.data(), count, GS_FLOAT32, GS_SUM, &cfg, &onHost), GS_OK)
        << gs_last_error();
    cfg.bucket_bytes = static_cast<int64_t>(3 * piece * 4);
    cfg.cuda_stream = reinterpret_cast<CUstream_st*>(s);
    ASSERT_EQ(gs_stream_open(comm, dev.p, count, GS_FLOAT32, GS_SUM, &cfg, &onDevice), GS_OK)
        << gs_last_error();
    for (int iter = 0; iter < kIterations; ++iter) {
      for (size_t i = 0; i < count; ++i)
        g[i] = gradient(r, i, iter);
      host = g;
      ASSERT_EQ(gs_stream_begin(onHost), GS_OK);
      ASSERT_EQ(gs_stream_ready(onHost, 0, count), GS_OK);
      ASSERT_EQ(gs_stream_wait(onHost, -1), GS_OK) << gs_last_error();
      ASSERT_EQ(gs_stream_begin(onDevice), GS_OK);
      const size_t half = count / 2;
      static int ms = 20;
      ASSERT_CUDA(cudaLaunchHostFunc(s, sleepOnStream, &ms));
      ASSERT_CUDA(cudaMemcpyAsync(dev.f() + half, g.data() + half, (count - half) * 4,
                                  cudaMemcpyHostToDevice, s));
      ASSERT_EQ(gs_stream_ready(onDevice, half, count - half), GS_OK) << gs_last_error();
      ASSERT_CUDA(cudaMemcpyAsync(dev.p, g.data(), half * 4, cudaMemcpyHostToDevice, s));
      ASSERT_EQ(gs_stream_ready(onDevice, 0, half), GS_OK) << gs_last_error();
      ASSERT_EQ(gs_stream_wait(onDevice, -1), GS_OK) << gs_last_error();
      ASSERT_CUDA(cudaMemcpy(out.data(), dev.p, count * 4, cudaMemcpyDeviceToHost));
      ASSERT_EQ(memcmp(out.data(), host.data(), count * 4), 0)
          << "rank " << r << " iteration " << iter;
    }
    std::vector<float> hostResidual(count), deviceResidual(count);
    ASSERT_EQ(gs_stream_save_residual(onHost, hostResidual.data(), count * 4), GS_OK);
    ASSERT_EQ(gs_stream_save_residual(onDevice, deviceResidual.data(), count * 4), GS_OK);
    EXPECT_EQ(hostResidual, deviceResidual);
    EXPECT_EQ(gs_stream_close(onDevice), GS_OK);
    EXPECT_EQ(gs_stream_close(onHost), GS_OK);
    ASSERT_CUDA(cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
  });
}

TEST_P(GpuCollective, SendRecvOnDeviceBuffersFollowTheStreams) {
  // gs_send of a device buffer its stream writes 30 ms after the call is made (the written
  // values travel), gs_recv into a device buffer a copy on the receiver's stream then reads;
  // then an exchange of gs_isend + gs_irecv posted by both ranks before either waits.
  constexpr int kRanks = 2;
  const size_t count = 300007;
  runRanks(kRanks, options(), [&](int r, gs_comm_t comm) {
    cudaStream_t s;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto* cs = reinterpret_cast<CUstream_st*>(s);
    DeviceBuffer send(count * 4), recv(count * 4);
    ASSERT_NE(send.p, nullptr);
    ASSERT_NE(recv.p, nullptr);
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i)
      in[i] = inputValue(r, i);
    ASSERT_CUDA(cudaMemset(send.p, 0, count * 4));
    ASSERT_CUDA(cudaMemset(recv.p, 0, count * 4));
    static int ms = 30;
    if (r == 0) {
      ASSERT_CUDA(cudaLaunchHostFunc(s, sleepOnStream, &ms));
      ASSERT_CUDA(cudaMemcpyAsync(send.p, in.data(), count * 4, cudaMemcpyHostToDevice, s));
      ASSERT_EQ(gs_send(send.p, count, GS_FLOAT32, 1, comm, cs), GS_OK) << gs_last_error();
    } else {
      ASSERT_EQ(gs_recv(recv.p, count, GS_FLOAT32, 0, comm, cs), GS_OK) << gs_last_error();
      ASSERT_CUDA(cudaMemcpyAsync(out.data(), recv.p, count * 4, cudaMemcpyDeviceToHost, s));
      ASSERT_CUDA(cudaStreamSynchronize(s));
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(out[i], inputValue(0, i)) << "element " << i;
    }
    ASSERT_CUDA(cudaStreamSynchronize(s));
    ASSERT_CUDA(cudaMemcpy(send.p, in.data(), count * 4, cudaMemcpyHostToDevice));
    gs_request_t reqs[2] = {nullptr, nullptr};
    ASSERT_EQ(gs_isend(send.p, count, GS_FLOAT32, 1 - r, comm, cs, &reqs[0]), GS_OK)
        << gs_last_error();
    ASSERT_EQ(gs_irecv(recv.p, count, GS_FLOAT32, 1 - r, comm, cs, &reqs[1]), GS_OK)
        << gs_last_error();
    for (gs_request_t req : reqs) {
      EXPECT_EQ(gs_wait(req, 20000), GS_OK) << gs_last_error();
      EXPECT_EQ(gs_request_free(req), GS_OK);
    }
    // Complete: the data is in device memory, for any stream.
    ASSERT_CUDA(cudaMemcpy(out.data(), recv.p, count * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(out[i], inputValue(1 - r, i)) << "rank " << r << " element " << i;
    ASSERT_CUDA(cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         GpuCollective,
                         ::testing::Values("shm", "tcp"),
                         [](const auto& p) { return std::string(p.param); });

}  // namespace
}  // namespace gs::testing
