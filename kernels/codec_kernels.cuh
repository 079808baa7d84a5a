#pragma once

// The codec kernels as templates over dtype and format; encode.cu, hop.cu and decode.cu
// instantiate them. Private to kernels/.
//
// Encode of a block format works on tiles of whole codec blocks (launch_config.h): pass 1 takes
// the absmax of every block of the tile into shared memory, the scales are written, pass 2
// quantizes. Element-wise formats are one grid-stride pass over groups. Error feedback outputs
// (the decoded values and the residual) are written in pass 2 from the codes just computed.

#include "kernels/cuda_check.h"
#include "kernels/formats.cuh"
#include "kernels/launch.h"

namespace gs::kernels::dev {

/// An incoming chunk of format F: metadata at in (block size, scales), payload after it.
struct InChunk {
  const uint8_t* in;
  uint32_t inAlign;
  const uint8_t* payload;
  uint32_t payloadAlign;
};

/// Decoded values (float) of group g (elements 8g ..), `valid` of them; block codecs read the
/// block size from the metadata (validated before any decode kernel runs).
template <CodecId F>
__device__ __forceinline__ void decodeGroup(
    const InChunk& c, uint32_t block, uint64_t g, int valid, float (&v)[kGroup]) {
  if constexpr (F == CodecId::kFp16 || F == CodecId::kBf16) {
    using E = Ew<F == CodecId::kBf16>;
    uint8_t b[E::kBytes];
    loadBytes<E::kBytes>(c.payload + g * E::kBytes, c.payloadAlign, 2 * valid, b);
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k)
      v[k] = E::get(static_cast<uint16_t>(b[2 * k] | (b[2 * k + 1] << 8)));
  } else {
    using B = Blk<F>;
    const float scale = loadF32(c.in + 4 + 4 * ((g * kGroup) / block), c.inAlign);
    uint8_t b[B::kBytes];
    loadBytes<B::kBytes>(c.payload + g * B::kBytes, c.payloadAlign, groupBytes<F>(valid), b);
    int32_t q[kGroup];
    unpackCodes<F>(b, q);
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k)
      v[k] = B::get(q[k]) * scale;
  }
}

// ---- sources of the values an encoder encodes ----------------------------------------------

/// A plain buffer of dtype D.
template <class D>
struct SrcLoader {
  using T = typename D::T;
  const T* src;
  uint32_t align;
  __device__ __forceinline__ void load(uint64_t i0, int valid, T (&x)[kGroup]) const {
    loadGroupRw(src + i0, align, valid, x);
  }
};

/// A ring hop: op(operand, decode(chunk)) rounded to dtype, as the CPU engine's scratch holds it.
template <class D, CodecId Fin>
struct HopLoader {
  using T = typename D::T;
  using C = typename D::C;
  InChunk chunk;
  const T* operand;
  uint32_t operandAlign;
  ReduceOp op;
  __device__ __forceinline__ void load(uint64_t i0, int valid, T (&x)[kGroup]) const {
    // The incoming block size is in the chunk's metadata (device memory, validated first).
    const uint32_t block =
        (Fin == CodecId::kFp16 || Fin == CodecId::kBf16) ? 0 : loadU32(chunk.in, chunk.inAlign);
    float v[kGroup];
    decodeGroup<Fin>(chunk, block, i0 / kGroup, valid, v);
    T a[kGroup];
    loadGroupRw(operand + i0, operandAlign, valid, a);
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k)
      x[k] = D::store(applyOp<C>(op, D::load(a[k]), static_cast<C>(v[k])));
  }
};

struct EncodeParams {
  uint64_t count;
  uint32_t block;
  uint32_t blocksPerTile;
  uint32_t tileElements;
  uint64_t tiles;
  bool inRegisters;
  uint8_t* scales;  // block formats: out + 4
  uint32_t scalesAlign;
  uint8_t* payload;
  uint32_t payloadAlign;
  bool sr;
  uint32_t key;
  void* decoded;
  uint32_t decodedAlign;
  void* residual;
  uint32_t residualAlign;
  double factor;
  const uint64_t* status;  // hops: the chunk's validation result; null for plain encodes
  uint8_t* header;         // block formats: where the block size goes (out)
};

/// Error-feedback outputs of one group: decoded values in dtype and the residual.
template <class D>
__device__ __forceinline__ void feedback(const EncodeParams& p,
                                         uint64_t i0,
                                         int valid,
                                         const typename D::T (&x)[kGroup],
                                         const float (&dec)[kGroup]) {
  using T = typename D::T;
  using C = typename D::C;
  using R = typename D::R;
  T d[kGroup];
#pragma unroll
  for (int k = 0; k < static_cast<int>(kGroup); ++k)
    d[k] = D::store(static_cast<C>(dec[k]));
  if (p.decoded != nullptr)
    storeGroup(static_cast<T*>(p.decoded) + i0, p.decodedAlign, valid, d);
  if (p.residual != nullptr) {
    R r[kGroup];
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k) {
      r[k] = D::resLoad(x[k]) - D::resLoad(d[k]);
      if (p.factor != 1.0)
        r[k] = static_cast<R>(r[k] * p.factor);
    }
    storeGroup(static_cast<R*>(p.residual) + i0, p.residualAlign, valid, r);
  }
}

template <class D, bool kBf16, class Loader>
__global__ void __launch_bounds__(kThreads) encodeEwKernel(EncodeParams p, Loader ld) {
  using T = typename D::T;
  using E = Ew<kBf16>;
  if (p.status != nullptr && statusFailed(p.status))
    return;
  const uint64_t groups = groupsOf(p.count);
  for (uint64_t g = firstGroup(); g < groups; g += groupStride()) {
    const uint64_t i0 = g * kGroup;
    const int valid = p.count - i0 < kGroup ? static_cast<int>(p.count - i0) : kGroup;
    T x[kGroup];
    ld.load(i0, valid, x);
    uint8_t b[E::kBytes];
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k) {
      const float xf = static_cast<float>(D::load(x[k]));
      const uint16_t w =
          E::put(xf, p.sr, p.sr ? math::srBits(p.key, static_cast<uint32_t>(i0 + k)) : 0);
      b[2 * k] = static_cast<uint8_t>(w);
      b[2 * k + 1] = static_cast<uint8_t>(w >> 8);
    }
    storeBytes<E::kBytes>(p.payload + g * E::kBytes, p.payloadAlign, 2 * valid, b);
    if (p.decoded != nullptr || p.residual != nullptr) {
      // The decoded values only where error feedback needs them (from the codes just stored).
      float dec[kGroup];
#pragma unroll
      for (int k = 0; k < static_cast<int>(kGroup); ++k)
        dec[k] = E::get(static_cast<uint16_t>(b[2 * k] | (b[2 * k + 1] << 8)));
      feedback<D>(p, i0, valid, x, dec);
    }
  }
}

/// Largest |x| of a group as float bits with the sign cleared (NaN/Inf above every finite).
template <class D>
__device__ __forceinline__ uint32_t groupAbsBits(const typename D::T (&x)[kGroup], int valid) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < static_cast<int>(kGroup); ++k) {
    const uint32_t a = floatBits(static_cast<float>(D::load(x[k]))) & 0x7fffffffu;
    m = (k < valid && a > m) ? a : m;
  }
  return m;
}

template <class D, CodecId F, class Loader>
__device__ __forceinline__ void quantizeGroup(const EncodeParams& p,
                                              uint64_t i0,
                                              int valid,
                                              const typename D::T (&x)[kGroup],
                                              float scale,
                                              float inv,
                                              bool quantize) {
  using B = Blk<F>;
  int32_t q[kGroup];
#pragma unroll
  for (int k = 0; k < static_cast<int>(kGroup); ++k) {
    const float xf = static_cast<float>(D::load(x[k]));
    const uint32_t rnd = p.sr ? math::srBits(p.key, static_cast<uint32_t>(i0 + k)) : 0;
    q[k] = (quantize && k < valid) ? B::put(xf, inv, p.sr, rnd) : 0;
  }
  uint8_t b[B::kBytes];
  packCodes<F>(q, b);
  storeBytes<B::kBytes>(p.payload + (i0 / kGroup) * B::kBytes, p.payloadAlign, groupBytes<F>(valid),
                        b);
  if (p.decoded != nullptr || p.residual != nullptr) {
    float dec[kGroup];
#pragma unroll
    for (int k = 0; k < static_cast<int>(kGroup); ++k)
      dec[k] = B::get(q[k]) * scale;
    feedback<D>(p, i0, valid, x, dec);
  }
}

template <class D, CodecId F, class Loader>
__global__ void __launch_bounds__(kThreads) encodeBlkKernel(EncodeParams p, Loader ld) {
  using T = typename D::T;
  __shared__ uint32_t sAbs[kThreads];
  __shared__ float sScale[kThreads];
  __shared__ float sInv[kThreads];
  __shared__ uint8_t sQuant[kThreads];
  if (p.status != nullptr && statusFailed(p.status))
    return;
  const uint32_t tid = threadIdx.x;
  if (blockIdx.x == 0 && tid == 0) {
    const uint32_t b = p.block;
    if (alignmentOf(p.header) >= 4) {
      *reinterpret_cast<uint32_t*>(p.header) = b;
    } else {
      memcpy(p.header, &b, 4);
    }
  }
  for (uint64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const uint64_t e0 = t * p.tileElements;
    const uint64_t e1 = p.count - e0 < p.tileElements ? p.count : e0 + p.tileElements;
    const uint32_t nb = static_cast<uint32_t>((e1 - e0 + p.block - 1) / p.block);
    const uint64_t groups = groupsOf(e1 - e0);
    for (uint32_t j = tid; j < nb; j += kThreads)
      sAbs[j] = 0;
    __syncthreads();
    T x[kGroup];
    if (p.inRegisters) {
      if (tid < groups) {
        const uint64_t i0 = e0 + tid * kGroup;
        const int valid = e1 - i0 < kGroup ? static_cast<int>(e1 - i0) : kGroup;
        ld.load(i0, valid, x);
        atomicMax(&sAbs[(tid * kGroup) / p.block], groupAbsBits<D>(x, valid));
      }
    } else {
      uint32_t m = 0;
      for (uint64_t g = tid; g < groups; g += kThreads) {
        const uint64_t i0 = e0 + g * kGroup;
        const int valid = e1 - i0 < kGroup ? static_cast<int>(e1 - i0) : kGroup;
        ld.load(i0, valid, x);
        const uint32_t a = groupAbsBits<D>(x, valid);
        m = a > m ? a : m;
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        const uint32_t o = __shfl_xor_sync(0xffffffffu, m, off);
        m = o > m ? o : m;
      }
      if ((tid & 31) == 0)
        atomicMax(&sAbs[0], m);
    }
    __syncthreads();
    for (uint32_t j = tid; j < nb; j += kThreads) {
      const math::BlockScale bs = math::blockScale(sAbs[j], Blk<F>::kQmax);
      sScale[j] = bs.scale;
      sInv[j] = bs.inv;
      sQuant[j] = bs.quantize ? 1 : 0;
      storeF32(p.scales + 4 * (e0 / p.block + j), p.scalesAlign, bs.scale);
    }
    __syncthreads();
    if (p.inRegisters) {
      if (tid < groups) {
        const uint64_t i0 = e0 + tid * kGroup;
        const int valid = e1 - i0 < kGroup ? static_cast<int>(e1 - i0) : kGroup;
        const uint32_t j = (tid * kGroup) / p.block;
        quantizeGroup<D, F, Loader>(p, i0, valid, x, sScale[j], sInv[j], sQuant[j] != 0);
      }
    } else {
      for (uint64_t g = tid; g < groups; g += kThreads) {
        const uint64_t i0 = e0 + g * kGroup;
        const int valid = e1 - i0 < kGroup ? static_cast<int>(e1 - i0) : kGroup;
        ld.load(i0, valid, x);
        quantizeGroup<D, F, Loader>(p, i0, valid, x, sScale[0], sInv[0], sQuant[0] != 0);
      }
    }
  }
}

/// Blocks for a launch covering `work` items of `perBlock` each on the current device.
inline uint32_t blocksFor(uint64_t work, uint64_t perBlock) {
  const DeviceInfo& d = currentDevice();
  return gridBlocks(work, perBlock, d.smCount, d.blocksPerSm);
}

/// As blocksFor, with the wave sized by what the kernel's registers allow to be resident
/// (cudaOccupancyMaxActiveBlocksPerMultiprocessor, asked once per kernel: a kernel over 32
/// registers a thread fits fewer than the device's blocksPerSm, and a grid of more blocks than
/// are resident runs a partial second wave). Not tested: the query on a kernel's first launch
/// inside a stream capture (GpuCodec.CallsOnlyEnqueueWork launches every kernel once before it
/// captures); it reads function attributes and enqueues nothing.
template <auto Kernel>
inline uint32_t blocksForKernel(uint64_t work, uint64_t perBlock) {
  static const uint32_t resident = [] {
    int n = 0;
    GS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, kThreads, 0));
    return n > 0 ? static_cast<uint32_t>(n) : 1u;
  }();
  const DeviceInfo& d = currentDevice();
  return gridBlocks(work, perBlock, d.smCount, resident < d.blocksPerSm ? resident : d.blocksPerSm);
}

/// Encode parameters from launcher arguments (block formats get their tiling).
inline EncodeParams encodeParams(const EncodeArgs& a, const uint64_t* status) {
  EncodeParams p{};
  const bool block = a.codec != CodecId::kFp16 && a.codec != CodecId::kBf16;
  p.count = a.count;
  p.block = block ? a.blockSize : 0;
  if (block) {
    const BlockTiling t = blockTiling(a.count, a.blockSize);
    p.blocksPerTile = t.blocksPerTile;
    p.tileElements = t.tileElements;
    p.tiles = t.tiles;
    p.inRegisters = t.inRegisters;
    const uint64_t nblocks = (a.count + a.blockSize - 1) / a.blockSize;
    p.header = a.out;
    p.scales = a.out + 4;
    p.payload = a.out + 4 + 4 * nblocks;
  } else {
    p.payload = a.out;
  }
  p.scalesAlign = alignmentOf(p.scales);
  p.payloadAlign = alignmentOf(p.payload);
  p.sr = a.stochastic;
  p.key = a.srKey;
  p.decoded = a.decodedOut;
  p.decodedAlign = alignmentOf(a.decodedOut);
  p.residual = a.residualOut;
  p.residualAlign = alignmentOf(a.residualOut);
  p.factor = a.residualFactor;
  p.status = status;
  return p;
}

/// Block formats with no elements still carry their block size.
template <int = 0>
__global__ void storeBlockSizeKernel(uint8_t* out, uint32_t block) {
  memcpy(out, &block, 4);
}

template <class D, CodecId F, class Loader>
void launchEncodeKernel(const EncodeParams& p, const Loader& ld, cudaStream_t stream) {
  if (p.count == 0) {
    if constexpr (F != CodecId::kFp16 && F != CodecId::kBf16)
      storeBlockSizeKernel<><<<1, 1, 0, stream>>>(p.header, p.block);
    return;
  }
  if constexpr (F == CodecId::kFp16 || F == CodecId::kBf16) {
    constexpr auto kernel = encodeEwKernel<D, F == CodecId::kBf16, Loader>;
    const uint32_t blocks = blocksForKernel<kernel>(groupsOf(p.count), kThreads);
    kernel<<<blocks, kThreads, 0, stream>>>(p, ld);
  } else {
    // Sized by blocksFor as before: the occupancy-sized grid was measured on the H200 only
    // together with a prefetch that made these kernels slower (docs/gpu.md), not on its own.
    const uint32_t blocks = blocksFor(p.tiles, 1);
    encodeBlkKernel<D, F, Loader><<<blocks, kThreads, 0, stream>>>(p, ld);
  }
}

}  // namespace gs::kernels::dev
