// Host side of the kernels: device queries (cached), pointer classification, the Workspace, and
// the launchers of launch.h dispatching to the per-file entry points (detail.h).
#include <array>
#include <mutex>
#include <utility>

#include "format/chunk_header.h"
#include "kernels/cuda_check.h"
#include "kernels/detail.h"
#include "kernels/launch.h"
#include "kernels/launch_config.h"

namespace gs::kernels {
namespace {

using format::CodecId;

constexpr uint64_t kStatusOk = ~uint64_t{0};

bool isBlock(CodecId id) {
  return id == CodecId::kFp8E4M3 || id == CodecId::kFp8E5M2 || id == CodecId::kInt8 ||
         id == CodecId::kInt4;
}

// Messages of the status codes (kernels/formats.cuh StatusCode), as the CPU decoders word them.
const char* statusMessage(uint64_t status) {
  const uint32_t code = static_cast<uint32_t>(status >> 48);
  const uint64_t item = status & 0xffffffffffffull;
  switch (code) {
    case 1:
      return "block size in the metadata is invalid";
    case 2:
      return "metadata size does not match the block size and element count";
    case 3:
      return item & 1 ? "infinite block scale" : "negative block scale";
    case 4:
      return "int4 padding nibble after an odd element count is not zero";
    case 5:
      return item & 1 ? "top-k index beyond the chunk's element count"
                      : "top-k indices are not strictly increasing";
    default:
      return "invalid chunk (unknown device status)";
  }
}

}  // namespace

const char* deviceUnavailableReason() {
  // cudaGetDeviceCount loads the driver on first use: on a host without one it reports
  // cudaErrorInsufficientDriver / cudaErrorNoDevice instead of failing to load the library.
  static const char* const kReason = []() -> const char* {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return cudaGetErrorString(e);
    }
    return n > 0 ? nullptr : "no CUDA device";
  }();
  return kReason;
}

MemoryKind classifyPointer(const void* p) {
  if (p == nullptr || deviceUnavailableReason() != nullptr)
    return MemoryKind::kHost;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return MemoryKind::kHost;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      return MemoryKind::kDevice;
    case cudaMemoryTypeManaged:
      return MemoryKind::kManaged;
    case cudaMemoryTypeHost:
      return MemoryKind::kPinnedHost;
    default:
      return MemoryKind::kHost;
  }
}

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kPinnedHost:
      return "pinned host";
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kManaged:
      return "managed";
  }
  return "unknown";
}

const DeviceInfo& currentDevice() {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceInfo, kMaxDevices> cache{};
  static std::array<std::once_flag, kMaxDevices> once;
  int dev = 0;
  GS_CHECK_CUDA(cudaGetDevice(&dev));
  GS_CHECK(dev >= 0 && dev < kMaxDevices, Errc::kUnsupported, "CUDA device %d: at most %d devices",
           dev, kMaxDevices);
  std::call_once(once[dev], [&] {
    cudaDeviceProp prop{};
    GS_CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
    DeviceInfo info{};
    info.device = dev;
    info.smCount = static_cast<uint32_t>(prop.multiProcessorCount);
    const uint32_t byThreads = static_cast<uint32_t>(prop.maxThreadsPerMultiProcessor) / kThreads;
    const uint32_t byBlocks = static_cast<uint32_t>(prop.maxBlocksPerMultiProcessor);
    info.blocksPerSm = byThreads < byBlocks ? byThreads : byBlocks;
    cache[dev] = info;
  });
  return cache[dev];
}

size_t topkWorkspaceBytes(uint64_t count, uint64_t k) {
  // TopkState and histogram (kernels/topk.cu), 16 bytes per tile, then k values of <= 8 bytes.
  return 64 + 4 * 2048 + 16 * topkTiles(count) + 8 * k;
}

Workspace::Workspace() {
  GS_CHECK_CUDA(cudaMalloc(&status_, sizeof(uint64_t)));
  const cudaError_t e = cudaMemset(status_, 0xff, sizeof(uint64_t));
  if (e != cudaSuccess) {
    cudaFree(status_);
    GS_CHECK_CUDA(e);
  }
}

Workspace::~Workspace() {
  // Frees wait for the device; errors are only logged by the caller's next CUDA call.
  if (topk_ != nullptr)
    (void)cudaFree(topk_);
  if (status_ != nullptr)
    (void)cudaFree(status_);
}

Workspace::Workspace(Workspace&& o) noexcept
    : status_(o.status_), topk_(o.topk_), topkBytes_(o.topkBytes_) {
  o.status_ = nullptr;
  o.topk_ = nullptr;
  o.topkBytes_ = 0;
}

Workspace& Workspace::operator=(Workspace&& o) noexcept {
  Workspace moved(std::move(o));
  std::swap(status_, moved.status_);
  std::swap(topk_, moved.topk_);
  std::swap(topkBytes_, moved.topkBytes_);
  return *this;  // moved frees what this held
}

void Workspace::reserveTopk(uint64_t count, uint64_t k) {
  const size_t need = topkWorkspaceBytes(count, k);
  if (need <= topkBytes_)
    return;
  // cudaFree waits for the device, so work in flight never sees the old buffer disappear.
  if (topk_ != nullptr) {
    GS_CHECK_CUDA(cudaFree(topk_));
    topk_ = nullptr;
    topkBytes_ = 0;
  }
  GS_CHECK_CUDA(cudaMalloc(&topk_, need));
  topkBytes_ = need;
}

const char* Workspace::takeError(CUstream_st* stream) {
  uint64_t status = kStatusOk;
  GS_CHECK_CUDA(cudaMemcpyAsync(&status, status_, sizeof(status), cudaMemcpyDeviceToHost, stream));
  GS_CHECK_CUDA(cudaStreamSynchronize(stream));
  if (status == kStatusOk)
    return nullptr;
  GS_CHECK_CUDA(cudaMemsetAsync(status_, 0xff, sizeof(uint64_t), stream));
  return statusMessage(status);
}

void launchEncode(const EncodeArgs& a, Workspace& ws, CUstream_st* stream) {
  GS_CHECK(a.count < (uint64_t{1} << 32), Errc::kInvalidArgument,
           "a chunk holds fewer than 2^32 elements (got %zu)", a.count);
  if (a.codec == CodecId::kRaw) {
    GS_CHECK(a.decodedOut == nullptr && a.residualOut == nullptr, Errc::kInvalidArgument,
             "raw encodes are exact: no error-feedback outputs");
    const size_t bytes = a.count * elementSize(a.dtype);
    if (bytes > 0)
      GS_CHECK_CUDA(cudaMemcpyAsync(a.out, a.src, bytes, cudaMemcpyDefault, stream));
    return;
  }
  if (a.codec == CodecId::kTopK) {
    ws.reserveTopk(a.count, a.topkK);
    return detail::topkEncode(a, ws.topk(), stream);
  }
  GS_CHECK(!isBlock(a.codec) || (a.blockSize >= 8 && a.blockSize <= 65536 && a.blockSize % 8 == 0),
           Errc::kInvalidArgument, "codec block size %u must be a multiple of 8 in [8, 65536]",
           a.blockSize);
  detail::encodeCodec(a, stream);
}

void launchDecode(const DecodeArgs& a, Workspace& ws, CUstream_st* stream) {
  if (a.codec == CodecId::kRaw) {
    if (!a.reduce) {
      if (a.payloadBytes > 0)
        GS_CHECK_CUDA(cudaMemcpyAsync(a.dst, a.in, a.payloadBytes, cudaMemcpyDefault, stream));
      return;
    }
    return detail::rawReduce(a, stream);
  }
  if (a.codec == CodecId::kTopK) {
    ws.reserveTopk(a.count, a.metaBytes / 4);
    return detail::topkDecode(a, ws.status(), ws.topk(), stream);
  }
  detail::decodeCodec(a, ws.status(), stream);
}

bool hopIsFused(CodecId in, CodecId out) {
  return in == out && in != CodecId::kRaw && in != CodecId::kTopK;
}

void launchDecodeReduceEncode(const DecodeArgs& in,
                              const EncodeArgs& out,
                              void* scratch,
                              Workspace& ws,
                              CUstream_st* stream) {
  GS_CHECK(in.dtype == out.dtype && in.count == out.count, Errc::kInvalidArgument,
           "a hop encodes what it reduced: same dtype and count");
  GS_CHECK(in.reduce, Errc::kInvalidArgument, "a hop reduces");
  const auto inBegin = reinterpret_cast<uintptr_t>(in.in);
  const auto inEnd = inBegin + in.metaBytes + in.payloadBytes;
  const auto outBegin = reinterpret_cast<uintptr_t>(out.out);
  GS_CHECK(outBegin >= inEnd || outBegin + 1 <= inBegin || (in.metaBytes + in.payloadBytes) == 0,
           Errc::kInvalidArgument, "a hop's encoded output must not overlap its input chunk");
  if (hopIsFused(in.codec, out.codec)) {
    // Validate the incoming metadata first; the fused kernel does nothing if that failed.
    if (isBlock(in.codec))
      detail::validateChunk(in, ws.status(), stream);
    return detail::hopFused(in, out, ws.status(), stream);
  }
  GS_CHECK(scratch != nullptr, Errc::kInvalidArgument,
           "hop from codec %d to codec %d needs a scratch buffer", static_cast<int>(in.codec),
           static_cast<int>(out.codec));
  DecodeArgs d = in;
  d.dst = scratch;
  launchDecode(d, ws, stream);
  EncodeArgs e = out;
  e.src = scratch;
  launchEncode(e, ws, stream);
}

}  // namespace gs::kernels
