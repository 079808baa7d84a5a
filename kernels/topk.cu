// Top-k on the device, bit-identical to codecs/topk.cc: an exact radix select of the k-th largest
// key (math::topkKey: |x|'s float bits, one common key for every NaN; three 11/11/10-bit
// histogram passes, the selection state kept in device memory so the host never waits), then an
// ordered compaction (per-tile counts, a scan over tiles, a block scan within each tile) that
// keeps every element above the threshold and the first ties in index order. Decode: validate
// indices, gather the reduced kept values, one elementwise pass, scatter.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/codec_kernels.cuh"
#include "kernels/detail.h"

namespace gs::kernels {
namespace dev {

/// Selection state at the start of the top-k workspace (runtime.cc sizes it).
struct TopkState {
  uint32_t prefix;
  uint32_t mask;
  uint64_t k;     // still to find among keys matching the prefix
  uint64_t ties;  // elements equal to the threshold to keep
};
inline constexpr size_t kTopkHistOffset = 64;
inline constexpr uint32_t kTopkBins = 2048;
inline constexpr size_t kTopkTilesOffset = kTopkHistOffset + 4 * kTopkBins;

struct TopkWs {
  TopkState* state;
  uint32_t* hist;
  uint32_t* tileCounts;  // 2 per tile: greater, equal
  uint32_t* tileBases;   // 2 per tile: exclusive prefix of each
  uint8_t* values;       // decode: k gathered values
};
inline TopkWs topkWs(uint8_t* base, uint64_t tiles) {
  TopkWs w;
  w.state = reinterpret_cast<TopkState*>(base);
  w.hist = reinterpret_cast<uint32_t*>(base + kTopkHistOffset);
  w.tileCounts = reinterpret_cast<uint32_t*>(base + kTopkTilesOffset);
  w.tileBases = w.tileCounts + 2 * tiles;
  w.values = reinterpret_cast<uint8_t*>(w.tileBases + 2 * tiles);
  return w;
}

/// The selection key, as codecs/topk.cc's: |x|'s float bits, every NaN the one key
/// math::kTopkNanKey (the GPU's NaNs carry other payloads than the CPU's).
template <class D>
__device__ __forceinline__ uint32_t keyOf(typename D::T x) {
  return math::topkKey(static_cast<float>(D::load(x)));
}

// Loads this thread's group of a tile (elements i0 .. i0 + kGroup - 1, those below count) and
// counts how many of their keys are above and equal to the threshold. Returns how many exist.
template <class D>
__device__ __forceinline__ int loadAndCountGroup(const typename D::T* src,
                                                 uint32_t align,
                                                 uint64_t count,
                                                 uint64_t i0,
                                                 uint32_t threshold,
                                                 typename D::T (&x)[kGroup],
                                                 uint32_t& greater,
                                                 uint32_t& equal) {
  const int valid = i0 >= count ? 0 : (count - i0 < kGroup ? static_cast<int>(count - i0) : kGroup);
  loadGroup(src + i0, align, valid, x);
  greater = 0;
  equal = 0;
#pragma unroll
  for (int k = 0; k < static_cast<int>(kGroup); ++k) {
    const uint32_t key = keyOf<D>(x[k]);
    greater += k < valid && key > threshold;
    equal += k < valid && key == threshold;
  }
  return valid;
}

__global__ void topkInitKernel(TopkWs w, uint64_t k) {
  for (uint32_t i = threadIdx.x; i < kTopkBins; i += blockDim.x)
    w.hist[i] = 0;
  if (threadIdx.x == 0)
    *w.state = TopkState{0, 0, k, 0};
}

template <class D>
__global__ void __launch_bounds__(kThreads) topkHistKernel(const typename D::T* src,
                                                           uint32_t align,
                                                           uint64_t count,
                                                           TopkWs w,
                                                           int shift,
                                                           uint32_t digitMask) {
  using T = typename D::T;
  __shared__ uint32_t hist[kTopkBins];
  for (uint32_t i = threadIdx.x; i < kTopkBins; i += blockDim.x)
    hist[i] = 0;
  __syncthreads();
  const uint32_t prefix = w.state->prefix, mask = w.state->mask;
  const uint64_t groups = groupsOf(count);
  for (uint64_t g = firstGroup(); g < groups; g += groupStride()) {
    const uint64_t i0 = g * kGroup;
    const int valid = count - i0 < kGroup ? static_cast<int>(count - i0) : kGroup;
    T x[kGroup];
    loadGroup(src + i0, align, valid, x);
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k) {
      const uint32_t key = keyOf<D>(x[k]);
      if (k < valid && (key & mask) == prefix)
        atomicAdd(&hist[(key >> shift) & digitMask], 1u);
    }
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i <= digitMask; i += blockDim.x) {
    if (hist[i] != 0)
      atomicAdd(&w.hist[i], hist[i]);
  }
}

/// One block: picks the digit holding the k-th largest key (codecs/topk.cc kthLargestKey), then
/// clears the histogram for the next pass.
__global__ void topkSelectKernel(TopkWs w, int shift, uint32_t digitMask) {
  if (threadIdx.x == 0) {
    TopkState s = *w.state;
    uint64_t above = 0;
    uint32_t digit = digitMask;
    for (;; --digit) {
      if (above + w.hist[digit] >= s.k || digit == 0)
        break;
      above += w.hist[digit];
    }
    s.k -= above;
    s.prefix |= digit << shift;
    s.mask |= digitMask << shift;
    *w.state = s;
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < kTopkBins; i += blockDim.x)
    w.hist[i] = 0;
}

/// Per tile of kTileElements: how many keys are above / equal to the threshold. Also writes
/// the residual of every element as if it were dropped (x - 0); the compaction overwrites the
/// kept ones.
template <class D>
__global__ void __launch_bounds__(kThreads) topkCountKernel(const typename D::T* src,
                                                            uint32_t align,
                                                            uint64_t count,
                                                            TopkWs w,
                                                            bool all,
                                                            typename D::R* residual,
                                                            uint32_t residualAlign,
                                                            double factor) {
  using T = typename D::T;
  using R = typename D::R;
  using BlockReduce = cub::BlockReduce<uint64_t, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  const uint32_t threshold = all ? 0 : w.state->prefix;
  const uint64_t tiles = topkTiles(count);
  for (uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const uint64_t i0 = t * kTileElements + threadIdx.x * kGroup;
    T x[kGroup];
    uint32_t greater, equal;
    const int valid = loadAndCountGroup<D>(src, align, count, i0, threshold, x, greater, equal);
    if (residual != nullptr && valid > 0) {
      R r[kGroup];
#pragma unroll
      for (int k = 0; k < static_cast<int>(kGroup); ++k) {
        r[k] = D::resLoad(x[k]) - D::resLoad(D::store(static_cast<typename D::C>(0)));
        if (factor != 1.0)
          r[k] = static_cast<R>(r[k] * factor);
      }
      storeGroup(residual + i0, residualAlign, valid, r);
    }
    const uint64_t both = BlockReduce(temp).Sum((static_cast<uint64_t>(greater) << 32) | equal);
    if (threadIdx.x == 0) {
      w.tileCounts[2 * t] = static_cast<uint32_t>(both >> 32);
      w.tileCounts[2 * t + 1] = static_cast<uint32_t>(both);
    }
    __syncthreads();
  }
}

/// One block: exclusive prefix over tiles of the greater and equal counts; ties = k - greater.
__global__ void __launch_bounds__(1024) topkScanKernel(TopkWs w, uint64_t tiles, uint64_t k) {
  using BlockScan = cub::BlockScan<uint64_t, 1024>;
  __shared__ typename BlockScan::TempStorage temp;
  const uint64_t per = (tiles + 1023) / 1024;
  const uint64_t b = threadIdx.x * per;
  const uint64_t e = b + per < tiles ? b + per : tiles;
  uint64_t sum = 0;
  for (uint64_t t = b; t < e; ++t)
    sum += (static_cast<uint64_t>(w.tileCounts[2 * t]) << 32) | w.tileCounts[2 * t + 1];
  uint64_t before = 0, total = 0;
  BlockScan(temp).ExclusiveSum(sum, before, total);
  for (uint64_t t = b; t < e; ++t) {
    w.tileBases[2 * t] = static_cast<uint32_t>(before >> 32);
    w.tileBases[2 * t + 1] = static_cast<uint32_t>(before);
    before += (static_cast<uint64_t>(w.tileCounts[2 * t]) << 32) | w.tileCounts[2 * t + 1];
  }
  if (threadIdx.x == 0)
    w.state->ties = k - (total >> 32);
}

/// Writes the kept (index, value) pairs in index order: an element's position is the number of
/// kept elements before it, greater + min(equal, ties).
template <class D>
__global__ void __launch_bounds__(kThreads) topkWriteKernel(const typename D::T* src,
                                                            uint32_t align,
                                                            uint64_t count,
                                                            TopkWs w,
                                                            bool all,
                                                            uint64_t k,
                                                            uint8_t* out,
                                                            typename D::R* residual,
                                                            uint32_t residualAlign,
                                                            double factor) {
  using T = typename D::T;
  using C = typename D::C;
  using BlockScan = cub::BlockScan<uint64_t, kThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  const uint32_t threshold = all ? 0 : w.state->prefix;
  const uint64_t ties = w.state->ties;
  const uint64_t tiles = topkTiles(count);
  for (uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const uint64_t i0 = t * kTileElements + threadIdx.x * kGroup;
    T x[kGroup];
    uint32_t greater, equal;
    const int valid = loadAndCountGroup<D>(src, align, count, i0, threshold, x, greater, equal);
    uint64_t before = 0;
    BlockScan(temp).ExclusiveSum((static_cast<uint64_t>(greater) << 32) | equal, before);
    uint64_t g = w.tileBases[2 * t] + (before >> 32);
    uint64_t e = w.tileBases[2 * t + 1] + static_cast<uint32_t>(before);
#pragma unroll
    for (int j = 0; j < static_cast<int>(kGroup); ++j) {
      const uint32_t key = keyOf<D>(x[j]);
      const bool isGreater = j < valid && key > threshold;
      const bool isEqual = j < valid && key == threshold;
      if (isGreater || (isEqual && e < ties)) {
        const uint64_t pos = g + (e < ties ? e : ties);
        if (pos < k) {
          const uint32_t idx = static_cast<uint32_t>(i0 + j);
          const float v = static_cast<float>(D::load(x[j]));
          memcpy(out + 4 * pos, &idx, 4);
          memcpy(out + 4 * k + 4 * pos, &v, 4);
          if (residual != nullptr) {
            using R = typename D::R;
            R r = D::resLoad(x[j]) - D::resLoad(D::store(static_cast<C>(v)));
            if (factor != 1.0)
              r = static_cast<R>(r * factor);
            storeElem(residual + i0 + j, residualAlign, r);
          }
        }
      }
      g += isGreater;
      e += isEqual;
    }
    __syncthreads();
  }
}

/// Error feedback: the decoded copy (0 where dropped, the kept value where kept), after every
/// read of the source (it may be the source itself).
template <class D>
__global__ void __launch_bounds__(kThreads)
    topkFillKernel(typename D::T* dst, uint32_t align, uint64_t count) {
  using T = typename D::T;
  const uint64_t groups = groupsOf(count);
  T z[kGroup];
#pragma unroll
  for (int k = 0; k < static_cast<int>(kGroup); ++k)
    z[k] = D::store(static_cast<typename D::C>(0));
  for (uint64_t g = firstGroup(); g < groups; g += groupStride()) {
    const uint64_t i0 = g * kGroup;
    const int valid = count - i0 < kGroup ? static_cast<int>(count - i0) : kGroup;
    storeGroup(dst + i0, align, valid, z);
  }
}
template <class D>
__global__ void __launch_bounds__(kThreads)
    topkScatterKeptKernel(const uint8_t* chunk, uint64_t k, typename D::T* dst, uint32_t align) {
  for (uint64_t j = firstGroup(); j < k; j += groupStride()) {
    uint32_t idx;
    float v;
    memcpy(&idx, chunk + 4 * j, 4);
    memcpy(&v, chunk + 4 * k + 4 * j, 4);
    storeElem(dst + idx, align, D::store(static_cast<typename D::C>(v)));
  }
}

// ---- decode ------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    topkValidateKernel(const uint8_t* in, uint64_t k, uint64_t count, uint64_t* status) {
  for (uint64_t j = firstGroup(); j < k; j += groupStride()) {
    uint32_t i, prev = 0;
    memcpy(&i, in + 4 * j, 4);
    if (j > 0)
      memcpy(&prev, in + 4 * (j - 1), 4);
    if (j > 0 && i <= prev)
      recordError(status, kErrTopkIndex, 2 * j);
    else if (i >= count)
      recordError(status, kErrTopkIndex, 2 * j + 1);
  }
}

struct TopkDecodeParams {
  const uint8_t* in;  // k indices then k values
  uint64_t k;
  uint64_t count;
  bool reduce;
  ReduceOp op;
  bool first;
  const void* operand;
  uint32_t operandAlign;
  void* dst;
  uint32_t dstAlign;
  const uint64_t* status;
};

/// values[j] = the final value of kept element j (computed before dst, which may be the operand,
/// is overwritten).
template <class D>
__global__ void __launch_bounds__(kThreads)
    topkGatherKernel(TopkDecodeParams p, typename D::T* values) {
  using T = typename D::T;
  using C = typename D::C;
  if (statusFailed(p.status))
    return;
  for (uint64_t j = firstGroup(); j < p.k; j += groupStride()) {
    uint32_t i;
    float v;
    memcpy(&i, p.in + 4 * j, 4);
    memcpy(&v, p.in + 4 * p.k + 4 * j, 4);
    if (!p.reduce) {
      values[j] = D::store(static_cast<C>(v));
    } else {
      const C a = D::load(loadElem(static_cast<const T*>(p.operand) + i, p.operandAlign));
      const C b = static_cast<C>(v);
      values[j] = D::store(p.first ? applyOp<C>(p.op, b, a) : applyOp<C>(p.op, a, b));
    }
  }
}

/// Every element as if not kept: 0 (decode), the operand (sum/avg), op(operand, 0) otherwise.
template <class D>
__global__ void __launch_bounds__(kThreads) topkBaseKernel(TopkDecodeParams p) {
  using T = typename D::T;
  using C = typename D::C;
  if (statusFailed(p.status))
    return;
  const bool sum = p.op == ReduceOp::kSum || p.op == ReduceOp::kAvg;
  const uint64_t groups = groupsOf(p.count);
  for (uint64_t g = firstGroup(); g < groups; g += groupStride()) {
    const uint64_t i0 = g * kGroup;
    const int valid = p.count - i0 < kGroup ? static_cast<int>(p.count - i0) : kGroup;
    T out[kGroup];
    if (!p.reduce) {
#pragma unroll
      for (int k = 0; k < static_cast<int>(kGroup); ++k)
        out[k] = D::store(static_cast<C>(0));
    } else {
      T a[kGroup];
      loadGroupRw(static_cast<const T*>(p.operand) + i0, p.operandAlign, valid, a);
#pragma unroll
      for (int k = 0; k < static_cast<int>(kGroup); ++k) {
        const C x = D::load(a[k]);
        const C z = static_cast<C>(0);
        out[k] = sum ? a[k] : D::store(p.first ? applyOp<C>(p.op, z, x) : applyOp<C>(p.op, x, z));
      }
    }
    storeGroup(static_cast<T*>(p.dst) + i0, p.dstAlign, valid, out);
  }
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    topkScatterKernel(TopkDecodeParams p, const typename D::T* values) {
  using T = typename D::T;
  if (statusFailed(p.status))
    return;
  for (uint64_t j = firstGroup(); j < p.k; j += groupStride()) {
    uint32_t i;
    memcpy(&i, p.in + 4 * j, 4);
    storeElem(static_cast<T*>(p.dst) + i, p.dstAlign, values[j]);
  }
}

}  // namespace dev

namespace detail {
namespace {

template <class D>
void encodeT(const EncodeArgs& a, uint8_t* wsBase, cudaStream_t s) {
  using T = typename D::T;
  const auto* src = static_cast<const T*>(a.src);
  const uint32_t align = alignmentOf(src);
  const uint64_t n = a.count, k = a.topkK;
  if (n == 0 || k == 0)
    return;
  const uint64_t tiles = topkTiles(n);
  const dev::TopkWs w = dev::topkWs(wsBase, tiles);
  const bool all = k >= n;  // as the CPU: no selection, threshold 0, every element kept
  dev::topkInitKernel<<<1, kThreads, 0, s>>>(w, k);
  if (!all) {
    const int shifts[3] = {21, 10, 0};
    const uint32_t masks[3] = {0x7ff, 0x7ff, 0x3ff};
    const uint32_t blocks = dev::blocksFor(groupsOf(n), kThreads);
    for (int pass = 0; pass < 3; ++pass) {
      dev::topkHistKernel<D>
          <<<blocks, kThreads, 0, s>>>(src, align, n, w, shifts[pass], masks[pass]);
      dev::topkSelectKernel<<<1, kThreads, 0, s>>>(w, shifts[pass], masks[pass]);
    }
  }
  auto* residual = static_cast<typename D::R*>(a.residualOut);
  const uint32_t tileBlocks = dev::blocksFor(tiles, 1);
  dev::topkCountKernel<D><<<tileBlocks, kThreads, 0, s>>>(src, align, n, w, all, residual,
                                                          alignmentOf(residual), a.residualFactor);
  dev::topkScanKernel<<<1, 1024, 0, s>>>(w, tiles, k);
  dev::topkWriteKernel<D><<<tileBlocks, kThreads, 0, s>>>(src, align, n, w, all, k, a.out, residual,
                                                          alignmentOf(residual), a.residualFactor);
  if (a.decodedOut != nullptr) {
    auto* dec = static_cast<T*>(a.decodedOut);
    dev::topkFillKernel<D>
        <<<dev::blocksFor(groupsOf(n), kThreads), kThreads, 0, s>>>(dec, alignmentOf(dec), n);
    dev::topkScatterKeptKernel<D>
        <<<dev::blocksFor(k, kThreads), kThreads, 0, s>>>(a.out, k, dec, alignmentOf(dec));
  }
}

template <class D>
void decodeT(const DecodeArgs& a, uint64_t* status, uint8_t* wsBase, cudaStream_t s) {
  using T = typename D::T;
  dev::TopkDecodeParams p{};
  p.in = a.in;
  p.k = a.metaBytes / 4;
  p.count = a.count;
  p.reduce = a.reduce;
  p.op = a.op;
  p.first = a.incomingFirst;
  p.operand = a.operand;
  p.operandAlign = alignmentOf(a.operand);
  p.dst = a.dst;
  p.dstAlign = alignmentOf(a.dst);
  p.status = status;
  if (a.count == 0)
    return;
  T* values = reinterpret_cast<T*>(dev::topkWs(wsBase, topkTiles(a.count)).values);
  if (p.k > 0) {
    const uint32_t kb = dev::blocksFor(p.k, kThreads);
    dev::topkValidateKernel<<<kb, kThreads, 0, s>>>(a.in, p.k, a.count, status);
    dev::topkGatherKernel<D><<<kb, kThreads, 0, s>>>(p, values);
  }
  dev::topkBaseKernel<D><<<dev::blocksFor(groupsOf(a.count), kThreads), kThreads, 0, s>>>(p);
  if (p.k > 0)
    dev::topkScatterKernel<D><<<dev::blocksFor(p.k, kThreads), kThreads, 0, s>>>(p, values);
}

}  // namespace

void topkEncode(const EncodeArgs& a, uint8_t* ws, CUstream_st* stream) {
  switch (a.dtype) {
    case DataType::kFloat32:
      encodeT<dev::F32>(a, ws, stream);
      break;
    case DataType::kFloat64:
      encodeT<dev::F64>(a, ws, stream);
      break;
    case DataType::kFloat16:
      encodeT<dev::F16>(a, ws, stream);
      break;
    case DataType::kBFloat16:
      encodeT<dev::BF16>(a, ws, stream);
      break;
    default:
      GS_CHECK(false, Errc::kInvalidArgument, "codec topk cannot encode %s (use raw)",
               dataTypeName(a.dtype));
  }
  GS_CHECK_CUDA(cudaGetLastError());
}

void topkDecode(const DecodeArgs& a, uint64_t* status, uint8_t* ws, CUstream_st* stream) {
  switch (a.dtype) {
    case DataType::kFloat32:
      decodeT<dev::F32>(a, status, ws, stream);
      break;
    case DataType::kFloat64:
      decodeT<dev::F64>(a, status, ws, stream);
      break;
    case DataType::kFloat16:
      decodeT<dev::F16>(a, status, ws, stream);
      break;
    case DataType::kBFloat16:
      decodeT<dev::BF16>(a, status, ws, stream);
      break;
    default:
      GS_CHECK(false, Errc::kInvalidArgument, "codec does not support %s", dataTypeName(a.dtype));
  }
  GS_CHECK_CUDA(cudaGetLastError());
}

}  // namespace detail
}  // namespace gs::kernels
