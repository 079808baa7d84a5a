// --device cuda: buffers in CUDA device memory. Compiled in every build; without CUDA
// (GS_HAVE_CUDA 0) it only says so, and the tool refuses --device cuda before starting ranks.
#include "gradstream/build_config.h"
#include "perf/buffers.h"

#if GS_HAVE_CUDA

#include <stdexcept>

#include <cuda_runtime.h>

namespace {

std::string cudaErrorText(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")";
}

void checkCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // reset the last error, so later calls report their own
    throw std::runtime_error(std::string(what) + " failed: " + cudaErrorText(e));
  }
}

struct CudaFree {
  void operator()(uint8_t* p) const noexcept { (void)cudaFree(p); }
};
struct StreamDestroy {
  void operator()(CUstream_st* s) const noexcept { (void)cudaStreamDestroy(s); }
};
using DevicePtr = std::unique_ptr<uint8_t, CudaFree>;
using StreamPtr = std::unique_ptr<CUstream_st, StreamDestroy>;

// One region: device memory and its host mirror, which is allocated without being written so an
// unchecked run (-c 0) does not touch (and count in the peak RSS) pages it never uses.
struct Region {
  size_t bytes = 0;
  DevicePtr device;
  std::unique_ptr<uint8_t[]> host;

  Region(size_t n, cudaStream_t stream) : bytes(n) {
    if (n == 0)
      return;
    void* p = nullptr;
    checkCuda(cudaMalloc(&p, n), ("cudaMalloc of " + std::to_string(n) + " bytes").c_str());
    device.reset(static_cast<uint8_t*>(p));
    // Zeros, like the host buffers, so -c 0 reduces defined values.
    checkCuda(cudaMemsetAsync(p, 0, n, stream), "cudaMemsetAsync");
    host = std::make_unique_for_overwrite<uint8_t[]>(n);
  }

  bool holds(const uint8_t* p) const { return host && p >= host.get() && p <= host.get() + bytes; }
  uint8_t* deviceAddress(const uint8_t* p) const { return device.get() + (p - host.get()); }
};

// The stream is created non-blocking (it does not wait for the legacy default stream, as a
// framework's side stream would not); every copy this class makes is on it, ordered with the
// collectives' own staging copies.
class CudaBuffers final : public Buffers {
 public:
  CudaBuffers(int device, size_t recvBytes, size_t sendBytes)
      : device_(device),
        stream_(createStream(device)),
        recv_(recvBytes, stream_.get()),
        send_(sendBytes, stream_.get()) {
    synchronize();
  }

  uint8_t* recv() override { return recv_.host.get(); }
  uint8_t* send() override { return send_.host.get(); }

  void* forCollective(const uint8_t* p) override {
    if (p == nullptr)
      return nullptr;
    if (recv_.holds(p))
      return recv_.deviceAddress(p);
    if (send_.holds(p))
      return send_.deviceAddress(p);
    throw std::logic_error("gradstream-perf: a buffer address outside its regions");
  }

  CUstream_st* stream() override { return stream_.get(); }

  void upload(const uint8_t* p, size_t bytes) override {
    checkCuda(cudaMemcpyAsync(forCollective(p), p, bytes, cudaMemcpyHostToDevice, stream_.get()),
              "cudaMemcpyAsync host to device");
    synchronize();  // the host view is pageable and may be rewritten at once
  }

  void download(uint8_t* p, size_t bytes) override {
    checkCuda(cudaMemcpyAsync(p, forCollective(p), bytes, cudaMemcpyDeviceToHost, stream_.get()),
              "cudaMemcpyAsync device to host");
    synchronize();
  }

  void synchronize() override {
    checkCuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
  }

  bool isDevice() const override { return true; }
  std::string describe() const override { return "cuda device " + std::to_string(device_); }

 private:
  static StreamPtr createStream(int device) {
    checkCuda(cudaSetDevice(device), ("cudaSetDevice(" + std::to_string(device) + ")").c_str());
    cudaStream_t s = nullptr;
    checkCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return StreamPtr(s);
  }

  // Acquisition order: the regions are freed before the stream they were zeroed on.
  int device_;
  StreamPtr stream_;
  Region recv_;
  Region send_;
};

}  // namespace

std::string cudaUnavailableReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return "no usable CUDA device: cudaGetDeviceCount: " + cudaErrorText(e);
  }
  if (n <= 0)
    return "no usable CUDA device: cudaGetDeviceCount found none";
  return "";
}

std::unique_ptr<Buffers> makeCudaBuffers(int localRank, size_t recvBytes, size_t sendBytes) {
  int n = 0;
  checkCuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  if (n <= 0)
    throw std::runtime_error("cudaGetDeviceCount found no CUDA device");
  const int device = (localRank < 0 ? 0 : localRank) % n;
  return std::make_unique<CudaBuffers>(device, recvBytes, sendBytes);
}

#else  // !GS_HAVE_CUDA

#include <stdexcept>

std::string cudaUnavailableReason() {
  return "this gradstream-perf was built without CUDA (GS_HAVE_CUDA is 0: configure with the CUDA "
         "toolkit installed, GS_WITH_CUDA=AUTO or ON)";
}

std::unique_ptr<Buffers> makeCudaBuffers(int, size_t, size_t) {
  throw std::runtime_error(cudaUnavailableReason());
}

#endif  // GS_HAVE_CUDA
