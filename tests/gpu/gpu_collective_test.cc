// Collectives on CUDA device buffers through the public C API (label gpu): ranks as threads
// sharing the one GPU, a real rendezvous on 127.0.0.1, shm and tcp links. Every call stages its
// buffers through pinned host memory on the rank's own stream (control/device_staging.h); the
// test reads results back with copies on that stream, so it checks the stream order the C API
// documents as well as the values. Skips, saying why, where no CUDA device is usable.
#include <chrono>
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

namespace gs::testing {
namespace {

const char* noDeviceReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return cudaGetErrorString(e);
  return n > 0 ? nullptr : "no CUDA device";
}

// Element i of rank r's input: small integers, exact in float32 sums.
float inputValue(int rank, size_t i) {
  return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 1000) - 300.f;
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

TEST_P(GpuCollective, HostBuffersWithAStreamAndRefusalsOfDeviceBuffers) {
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
    // Non-blocking calls cannot keep stream order: device buffers are refused by name.
    gs_request_t req = nullptr;
    EXPECT_EQ(gs_iallreduce(src.p, src.p, count, GS_FLOAT32, GS_SUM, comm, nullptr, &req),
              GS_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(gs_last_error()).find("host buffers only"), std::string::npos)
        << gs_last_error();
    gs_stream_t gstream = nullptr;
    EXPECT_EQ(gs_stream_open(comm, src.p, count, GS_FLOAT32, GS_SUM, nullptr, &gstream),
              GS_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(gs_last_error()).find("gradient streams take host buffers"),
              std::string::npos)
        << gs_last_error();
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         GpuCollective,
                         ::testing::Values("shm", "tcp"),
                         [](const auto& p) { return std::string(p.param); });

}  // namespace
}  // namespace gs::testing
