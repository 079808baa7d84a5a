// The CUDA kernels against the CPU codecs (label gpu): on random data of odd sizes every codec's
// device encode writes the CPU encoder's bytes, device decode / decode-reduce / the fused hop
// give the CPU's values, error feedback matches, outputs are poisoned with a sentinel to catch
// overruns, invalid chunks leave the destination untouched, and everything only enqueues work
// (the calls run under CUDA graph capture, which rejects any synchronizing call). Skips, saying
// why, where no CUDA device is usable.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "codecs/codec.h"
#include "codecs/device_codec.h"
#include "format/half.h"
#include "gpu/cuda_assert.h"

namespace gs::codecs {
namespace {

constexpr uint8_t kSentinel = 0xa5;
constexpr size_t kGuard = 256;  // poisoned bytes after every output

/// Device memory, poisoned with the sentinel, with kGuard extra bytes (and an optional offset
/// to test unaligned buffers). Every method is complete on the device when it returns: the
/// codecs run on a non-blocking stream, which does not wait for the legacy default stream that
/// cudaMemset / cudaMemcpy use, and a pageable cudaMemcpy to the device may return before its
/// last bytes landed (on the H200 the 2^20+3-element encodes read a stale tail without this).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, size_t offset = 0) : bytes_(bytes), offset_(offset) {
    EXPECT_EQ(cudaMalloc(&base_, bytes + kGuard + offset), cudaSuccess);
    poison();
  }
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(base_) + offset_; }
  void poison() {
    EXPECT_EQ(cudaMemset(base_, kSentinel, bytes_ + kGuard + offset_), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void upload(const void* src, size_t n) {
    EXPECT_EQ(cudaMemcpy(get(), src, n, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  /// The bytes plus the guard, after all work on the device.
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(bytes_ + kGuard);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), get(), v.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_;
  size_t offset_;
};

bool guardIntact(const std::vector<uint8_t>& v, size_t used) {
  for (size_t i = used; i < v.size(); ++i) {
    if (v[i] != kSentinel)
      return false;
  }
  return true;
}

bool isNanBits(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kFloat32: {
      float f;
      memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case DataType::kFloat64: {
      double d;
      memcpy(&d, p, 8);
      return std::isnan(d);
    }
    case DataType::kFloat16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    }
    case DataType::kBFloat16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
    }
    default:
      return false;
  }
}

/// Index of the first element whose bits differ (NaN equals NaN: the GPU's NaN is canonical
/// where x86 keeps a payload), or -1.
long firstMismatch(DataType t, const uint8_t* a, const uint8_t* b, size_t n) {
  const size_t es = elementSize(t);
  for (size_t i = 0; i < n; ++i) {
    if (memcmp(a + i * es, b + i * es, es) == 0)
      continue;
    if (isNanBits(t, a + i * es) && isNanBits(t, b + i * es))
      continue;
    return static_cast<long>(i);
  }
  return -1;
}

/// Random values in dtype: normal, scaled per 64 elements by 10^[-4, 4], with specials
/// (NaN, +-Inf, beyond fp16 range, denormal, -0) sprinkled in when requested.
std::vector<uint8_t> randomData(DataType t, size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> expo(-4, 4);
  std::vector<uint8_t> out(n * elementSize(t));
  double scale = 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % 64 == 0)
      scale = std::pow(10.0, expo(rng));
    double v = normal(rng) * scale;
    if (specials && rng() % 997 == 0) {
      const double kSpecial[] = {std::numeric_limits<double>::quiet_NaN(),
                                 HUGE_VAL,
                                 -HUGE_VAL,
                                 70000.0,
                                 1e-40,
                                 -0.0,
                                 3e38};
      v = kSpecial[rng() % 7];
    }
    switch (t) {
      case DataType::kFloat32: {
        const float f = static_cast<float>(v);
        memcpy(out.data() + 4 * i, &f, 4);
        break;
      }
      case DataType::kFloat64:
        memcpy(out.data() + 8 * i, &v, 8);
        break;
      case DataType::kFloat16: {
        const uint16_t h = format::floatToHalf(static_cast<float>(v));
        memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t h = format::floatToBf16(static_cast<float>(v));
        memcpy(out.data() + 2 * i, &h, 2);
        break;
      }
      case DataType::kInt32: {
        const int32_t x = static_cast<int32_t>(rng());
        memcpy(out.data() + 4 * i, &x, 4);
        break;
      }
      case DataType::kInt64: {
        const int64_t x = static_cast<int64_t>((uint64_t{rng()} << 32) | rng());
        memcpy(out.data() + 8 * i, &x, 8);
        break;
      }
      case DataType::kUInt8:
        out[i] = static_cast<uint8_t>(rng());
        break;
    }
  }
  return out;
}

const char* const kCodecs[] = {"fp16",
                               "bf16",
                               "fp16,sr",
                               "bf16,sr",
                               "fp8e4m3",
                               "fp8e5m2",
                               "fp8e4m3,sr",
                               "int8",
                               "int8,sr",
                               "int4",
                               "int4,sr",
                               "int8,block=24",
                               "int4,block=4096",
                               "fp8e5m2,block=8",
                               "topk:0.01",
                               "topk:0.3",
                               "topk:1",
                               "raw"};
const DataType kFloatTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                                DataType::kFloat64};
const size_t kSizes[] = {1, 7, 4097, (size_t{1} << 20) + 3};

class GpuCodec : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* why = deviceUnavailableReason())
      GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr)
      cudaStreamDestroy(stream_);
  }
  CUstream_st* stream() const { return reinterpret_cast<CUstream_st*>(stream_); }
  cudaStream_t stream_ = nullptr;
};

// Specials in 64-bit sources are left out where the byte comparison would see a NaN converted
// to float (the payload differs between the CPU's and the GPU's conversion); Inf stays in.
bool withSpecials(DataType t) {
  return t != DataType::kFloat64;
}

TEST_F(GpuCodec, EncodeWritesTheCpuBytes) {
  for (const char* text : kCodecs) {
    const CodecSpec spec = CodecSpec::parse(text);
    const auto cpu = makeCodec(spec);
    auto dev = DeviceCodec::create(spec);
    for (DataType t : kFloatTypes) {
      for (size_t n : kSizes) {
        SCOPED_TRACE(testing::Message() << text << " " << dataTypeName(t) << " n=" << n);
        const auto src = randomData(t, n, static_cast<uint32_t>(n * 31 + int(t)), withSpecials(t));
        std::vector<uint8_t> want(cpu->maxEncodedBytes(t, n) + 8);
        const EncodedSize ws = cpu->encode(t, src.data(), n, want.data(), 12345);
        const size_t used = ws.metaBytes + ws.payloadBytes;
        for (size_t offset : {size_t{0}, size_t{4}}) {  // aligned and 4-byte aligned outputs
          DeviceBuffer dsrc(src.size()), dout(cpu->maxEncodedBytes(t, n), offset);
          dsrc.upload(src.data(), src.size());
          const EncodedSize gs = dev->encode(t, dsrc.get(), n, dout.get(), 12345, stream());
          ASSERT_CUDA(cudaStreamSynchronize(stream_));
          ASSERT_CUDA(cudaGetLastError());
          EXPECT_EQ(gs.metaBytes, ws.metaBytes);
          EXPECT_EQ(gs.payloadBytes, ws.payloadBytes);
          const auto got = dout.download();
          EXPECT_EQ(memcmp(got.data(), want.data(), used), 0)
              << "offset " << offset << ": first differing byte "
              << std::mismatch(got.begin(), got.begin() + used, want.begin()).first - got.begin();
          EXPECT_TRUE(guardIntact(got, used))
              << "wrote past the encoding (offset " << offset << ")";
        }
      }
    }
  }
}

TEST_F(GpuCodec, DecodeReduceGivesTheCpuValues) {
  const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                           ReduceOp::kProd};
  for (const char* text : kCodecs) {
    const CodecSpec spec = CodecSpec::parse(text);
    const auto cpu = makeCodec(spec);
    auto dev = DeviceCodec::create(spec);
    for (DataType t : kFloatTypes) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{4097}, size_t{100003}}) {
        const size_t bytes = n * elementSize(t);
        const auto src = randomData(t, n, static_cast<uint32_t>(n + 7), true);
        const auto operand = randomData(t, n, static_cast<uint32_t>(n + 8), true);
        std::vector<uint8_t> chunk(cpu->maxEncodedBytes(t, n) + 8);
        const EncodedSize es = cpu->encode(t, src.data(), n, chunk.data(), 99);
        DeviceBuffer din(chunk.size()), dop(bytes), ddst(bytes, 2);
        din.upload(chunk.data(), chunk.size());
        dop.upload(operand.data(), bytes);
        // -1: plain decode; then every op, with the incoming value first and second.
        for (int o = -1; o < 5; ++o) {
          for (bool first : {false, true}) {
            if (o < 0 && first)
              continue;
            SCOPED_TRACE(testing::Message() << text << " " << dataTypeName(t) << " n=" << n
                                            << " op=" << o << " first=" << first);
            std::vector<uint8_t> want(bytes);
            const char* why =
                o < 0 ? cpu->decode({.dtype = t,
                                     .count = n,
                                     .bytes = chunk.data(),
                                     .metaBytes = es.metaBytes,
                                     .payloadBytes = es.payloadBytes},
                                    want.data())
                      : cpu->decodeReduce({.dtype = t,
                                           .count = n,
                                           .bytes = chunk.data(),
                                           .metaBytes = es.metaBytes,
                                           .payloadBytes = es.payloadBytes},
                                          {kOps[o], operand.data(), first}, want.data());
            ASSERT_EQ(why, nullptr) << why;
            ddst.poison();
            why = o < 0 ? dev->decode({.codec = static_cast<uint8_t>(spec.id),
                                       .dtype = t,
                                       .count = n,
                                       .bytes = din.get(),
                                       .metaBytes = es.metaBytes,
                                       .payloadBytes = es.payloadBytes},
                                      ddst.get(), stream())
                        : dev->decodeReduce({.codec = static_cast<uint8_t>(spec.id),
                                             .dtype = t,
                                             .count = n,
                                             .bytes = din.get(),
                                             .metaBytes = es.metaBytes,
                                             .payloadBytes = es.payloadBytes},
                                            {kOps[o], dop.get(), first}, ddst.get(), stream());
            ASSERT_EQ(why, nullptr) << why;
            EXPECT_EQ(dev->takeError(stream()), nullptr);
            const auto got = ddst.download();
            EXPECT_EQ(firstMismatch(t, got.data(), want.data(), n), -1);
            EXPECT_TRUE(guardIntact(got, bytes));
          }
        }
      }
    }
  }
}

TEST_F(GpuCodec, RawReduceOfEveryDtypeInPlace) {
  auto dev = DeviceCodec::create(CodecSpec::parse("raw"));
  for (int ti = 0; ti < kNumDataTypes; ++ti) {
    const auto t = static_cast<DataType>(ti);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
      const size_t n = 4097, bytes = n * elementSize(t);
      SCOPED_TRACE(testing::Message() << dataTypeName(t) << " op " << int(op));
      const auto in = randomData(t, n, 3, true), acc = randomData(t, n, 4, true);
      std::vector<uint8_t> want(bytes);
      ASSERT_EQ(makeCodec(CodecSpec::parse("raw"))
                    ->decodeReduce({.dtype = t,
                                    .count = n,
                                    .bytes = in.data(),
                                    .metaBytes = 0,
                                    .payloadBytes = static_cast<uint32_t>(bytes)},
                                   {op, acc.data(), false}, want.data()),
                nullptr);
      DeviceBuffer din(bytes), dacc(bytes);
      din.upload(in.data(), bytes);
      dacc.upload(acc.data(), bytes);
      ASSERT_EQ(dev->decodeReduce({.codec = 0,
                                   .dtype = t,
                                   .count = n,
                                   .bytes = din.get(),
                                   .metaBytes = 0,
                                   .payloadBytes = static_cast<uint32_t>(bytes)},
                                  {op, dacc.get(), false}, dacc.get(), stream()),
                nullptr);
      ASSERT_CUDA(cudaStreamSynchronize(stream_));
      const auto got = dacc.download();
      EXPECT_EQ(firstMismatch(t, got.data(), want.data(), n), -1);
      EXPECT_TRUE(guardIntact(got, bytes));
    }
  }
}

// A ring hop: CPU decodeReduce into scratch then encode; device fused (same codec) or through
// scratch (the chunk arrived with another codec). Compared by decoding both encodings on the
// CPU (values, NaN-aware) and by the bytes when the data has no NaN.
TEST_F(GpuCodec, HopDecodeReduceEncodeMatchesTheCpu) {
  const char* const kHops[][2] = {{"int8", "int8"},
                                  {"fp8e4m3", "fp8e4m3"},
                                  {"int4", "int4"},
                                  {"bf16", "bf16"},
                                  {"fp16,sr", "fp16,sr"},
                                  {"int8,sr", "int8,sr"},
                                  {"int8,block=64", "int8,block=128"},
                                  {"raw", "int8"},
                                  {"int8", "topk:0.1"}};
  for (const auto& hop : kHops) {
    const CodecSpec inSpec = CodecSpec::parse(hop[0]), outSpec = CodecSpec::parse(hop[1]);
    const auto cpuIn = makeCodec(inSpec), cpuOut = makeCodec(outSpec);
    auto dev = DeviceCodec::create(outSpec);
    for (DataType t : kFloatTypes) {
      for (size_t n : {size_t{7}, size_t{4097}, size_t{(1 << 20) + 3}}) {
        for (bool specials : {false, true}) {
          SCOPED_TRACE(testing::Message() << hop[0] << " -> " << hop[1] << " " << dataTypeName(t)
                                          << " n=" << n << " specials " << specials);
          const size_t bytes = n * elementSize(t);
          const auto x = randomData(t, n, 11, specials), operand = randomData(t, n, 12, specials);
          std::vector<uint8_t> chunk(cpuIn->maxEncodedBytes(t, n) + 8);
          const EncodedSize ein = cpuIn->encode(t, x.data(), n, chunk.data(), 5);
          std::vector<uint8_t> values(bytes), want(cpuOut->maxEncodedBytes(t, n) + 8);
          ASSERT_EQ(cpuIn->decodeReduce({.dtype = t,
                                         .count = n,
                                         .bytes = chunk.data(),
                                         .metaBytes = ein.metaBytes,
                                         .payloadBytes = ein.payloadBytes},
                                        {ReduceOp::kSum, operand.data(), false}, values.data()),
                    nullptr);
          const EncodedSize eout = cpuOut->encode(t, values.data(), n, want.data(), 77);
          DeviceBuffer din(chunk.size()), dop(bytes), dout(want.size()), scratch(bytes);
          din.upload(chunk.data(), chunk.size());
          dop.upload(operand.data(), bytes);
          EncodedSize written{};
          ASSERT_EQ(dev->decodeReduceEncode({.codec = static_cast<uint8_t>(inSpec.id),
                                             .dtype = t,
                                             .count = n,
                                             .bytes = din.get(),
                                             .metaBytes = ein.metaBytes,
                                             .payloadBytes = ein.payloadBytes},
                                            {ReduceOp::kSum, dop.get()}, dout.get(), 77,
                                            scratch.get(), stream(), &written),
                    nullptr);
          EXPECT_EQ(dev->takeError(stream()), nullptr);
          ASSERT_EQ(written.metaBytes, eout.metaBytes);
          ASSERT_EQ(written.payloadBytes, eout.payloadBytes);
          const auto got = dout.download();
          const size_t used = eout.metaBytes + eout.payloadBytes;
          EXPECT_TRUE(guardIntact(got, used));
          if (!specials) {
            EXPECT_EQ(memcmp(got.data(), want.data(), used), 0);
          }
          std::vector<uint8_t> a(bytes), b(bytes);
          ASSERT_EQ(cpuOut->decode({.dtype = t,
                                    .count = n,
                                    .bytes = got.data(),
                                    .metaBytes = eout.metaBytes,
                                    .payloadBytes = eout.payloadBytes},
                                   a.data()),
                    nullptr);
          ASSERT_EQ(cpuOut->decode({.dtype = t,
                                    .count = n,
                                    .bytes = want.data(),
                                    .metaBytes = eout.metaBytes,
                                    .payloadBytes = eout.payloadBytes},
                                   b.data()),
                    nullptr);
          EXPECT_EQ(firstMismatch(t, a.data(), b.data(), n), -1);
        }
      }
    }
  }
}

TEST_F(GpuCodec, ErrorFeedbackInTheEncodePass) {
  for (const char* text : {"int4", "int8,sr", "fp8e5m2", "bf16", "topk:0.05"}) {
    const CodecSpec spec = CodecSpec::parse(text);
    const auto cpu = makeCodec(spec);
    auto dev = DeviceCodec::create(spec);
    for (DataType t : kFloatTypes) {
      for (double factor : {1.0, 4.0}) {
        const size_t n = 4097, bytes = n * elementSize(t), rbytes = n * residualElementSize(t);
        SCOPED_TRACE(testing::Message() << text << " " << dataTypeName(t) << " factor " << factor);
        const auto x = randomData(t, n, 21, withSpecials(t));
        std::vector<uint8_t> chunk(cpu->maxEncodedBytes(t, n)), decoded(bytes), residual(rbytes);
        const EncodedSize es = cpu->encode(t, x.data(), n, chunk.data(), 3);
        ASSERT_EQ(cpu->decode({.dtype = t,
                               .count = n,
                               .bytes = chunk.data(),
                               .metaBytes = es.metaBytes,
                               .payloadBytes = es.payloadBytes},
                              decoded.data()),
                  nullptr);
        updateResidual(t, x.data(), decoded.data(), residual.data(), n);
        if (factor != 1.0) {  // as the engine scales an averaged block's residual
          for (size_t i = 0; i < n; ++i) {
            if (t == DataType::kFloat64) {
              double r;
              memcpy(&r, residual.data() + 8 * i, 8);
              r *= factor;
              memcpy(residual.data() + 8 * i, &r, 8);
            } else {
              float r;
              memcpy(&r, residual.data() + 4 * i, 4);
              r = static_cast<float>(r * factor);
              memcpy(residual.data() + 4 * i, &r, 4);
            }
          }
        }
        DeviceBuffer dx(bytes), dout(chunk.size()), ddec(bytes), dres(rbytes);
        dx.upload(x.data(), bytes);
        DeviceFeedback fb{ddec.get(), dres.get(), factor};
        dev->encode(t, dx.get(), n, dout.get(), 3, stream(), fb);
        ASSERT_CUDA(cudaStreamSynchronize(stream_));
        const auto gotDec = ddec.download(), gotRes = dres.download();
        EXPECT_EQ(firstMismatch(t, gotDec.data(), decoded.data(), n), -1);
        const DataType rt = t == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
        EXPECT_EQ(firstMismatch(rt, gotRes.data(), residual.data(), n), -1);
        EXPECT_TRUE(guardIntact(gotDec, bytes));
        EXPECT_TRUE(guardIntact(gotRes, rbytes));
      }
    }
  }
}

TEST_F(GpuCodec, StochasticRoundingSameSeedSameBits) {
  for (const char* text : {"int8,sr", "int4,sr", "fp8e4m3,sr", "fp16,sr", "bf16,sr"}) {
    const CodecSpec spec = CodecSpec::parse(text);
    auto dev = DeviceCodec::create(spec);
    const size_t n = 100003, bytes = 4 * n;
    const auto x = randomData(DataType::kFloat32, n, 5, false);
    const size_t maxOut = makeCodec(spec)->maxEncodedBytes(DataType::kFloat32, n);
    DeviceBuffer dx(bytes), a(maxOut), b(maxOut), c(maxOut);
    dx.upload(x.data(), bytes);
    dev->encode(DataType::kFloat32, dx.get(), n, a.get(), 42, stream());
    dev->encode(DataType::kFloat32, dx.get(), n, b.get(), 42, stream());
    dev->encode(DataType::kFloat32, dx.get(), n, c.get(), 43, stream());
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    EXPECT_EQ(a.download(), b.download()) << text;
    EXPECT_NE(a.download(), c.download()) << text << ": another seed, other rounding";
  }
}

TEST_F(GpuCodec, NanAndInfFollowTheDocumentedPolicy) {
  // Block codecs: a NaN or Inf poisons its block (every element decodes to NaN), other blocks
  // are unaffected; fp16: beyond 65504 becomes Inf, NaN stays NaN.
  const size_t n = 512;
  std::vector<float> x(n, 1.5f);
  x[3] = std::numeric_limits<float>::infinity();
  x[300] = std::numeric_limits<float>::quiet_NaN();
  x[400] = 1e6f;
  for (const char* text : {"int8", "int4", "fp8e4m3", "fp8e5m2"}) {
    auto dev = DeviceCodec::create(CodecSpec::parse(text));
    DeviceBuffer dx(4 * n), dout(4 * n + 4096), ddst(4 * n);
    dx.upload(x.data(), 4 * n);
    const EncodedSize es = dev->encode(DataType::kFloat32, dx.get(), n, dout.get(), 0, stream());
    ASSERT_EQ(dev->decode({.codec = static_cast<uint8_t>(dev->id()),
                           .dtype = DataType::kFloat32,
                           .count = n,
                           .bytes = dout.get(),
                           .metaBytes = es.metaBytes,
                           .payloadBytes = es.payloadBytes},
                          ddst.get(), stream()),
              nullptr);
    EXPECT_EQ(dev->takeError(stream()), nullptr);
    const auto got = ddst.download();
    const float* y = reinterpret_cast<const float*>(got.data());
    for (size_t i = 0; i < n; ++i) {
      if (i < 256 || (i >= 256 && i < 512 && x[300] != x[300])) {
        EXPECT_TRUE(std::isnan(y[i])) << text << " element " << i << " of a poisoned block";
      }
    }
  }
  auto fp16 = DeviceCodec::create(CodecSpec::parse("fp16"));
  std::vector<float> v = {70000.0f, -70000.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
  DeviceBuffer dv(16), dout(8), ddst(16);
  dv.upload(v.data(), 16);
  fp16->encode(DataType::kFloat32, dv.get(), 4, dout.get(), 0, stream());
  ASSERT_EQ(fp16->decode({.codec = 1,
                          .dtype = DataType::kFloat32,
                          .count = 4,
                          .bytes = dout.get(),
                          .metaBytes = 0,
                          .payloadBytes = 8},
                         ddst.get(), stream()),
            nullptr);
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  const auto got = ddst.download();
  const float* y = reinterpret_cast<const float*>(got.data());
  EXPECT_EQ(y[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[1], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(y[2]));
  EXPECT_EQ(y[3], 1.0f);
}

TEST_F(GpuCodec, InvalidChunkContentLeavesTheDestinationUntouched) {
  const size_t n = 1000, bytes = 4 * n;
  const auto x = randomData(DataType::kFloat32, n, 9, false);
  struct Case {
    const char* codec;
    size_t byte;  // offset of the corrupted byte
    uint8_t value;
    const char* reason;
  };
  const Case cases[] = {
      {"int8", 0, 7, "block size in the metadata is invalid"},
      {"int8", 4 + 4 * 2 + 3, 0x80, "negative block scale"},
      {"int4,block=8", 4 + 4 * 125 + 499, 0xf0,
       "int4 padding nibble after an odd element count is not zero"},
      {"topk:0.1", 4 * 5, 0xff, "top-k indices are not strictly increasing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.codec);
    const CodecSpec spec = CodecSpec::parse(c.codec);
    const auto cpu = makeCodec(spec);
    const size_t count = std::string(c.codec).find("int4") != std::string::npos ? 999 : n;
    std::vector<uint8_t> chunk(cpu->maxEncodedBytes(DataType::kFloat32, count));
    const EncodedSize es = cpu->encode(DataType::kFloat32, x.data(), count, chunk.data(), 0);
    ASSERT_LT(c.byte, size_t{es.metaBytes} + es.payloadBytes);
    chunk[c.byte] = c.value;
    std::vector<uint8_t> scratch(bytes);
    ASSERT_STREQ(cpu->decode({.dtype = DataType::kFloat32,
                              .count = count,
                              .bytes = chunk.data(),
                              .metaBytes = es.metaBytes,
                              .payloadBytes = es.payloadBytes},
                             scratch.data()),
                 c.reason)
        << "the case corrupts what the CPU decoder rejects";
    auto dev = DeviceCodec::create(spec);
    DeviceBuffer din(chunk.size()), ddst(bytes);
    din.upload(chunk.data(), chunk.size());
    ASSERT_EQ(dev->decodeReduce({.codec = static_cast<uint8_t>(spec.id),
                                 .dtype = DataType::kFloat32,
                                 .count = count,
                                 .bytes = din.get(),
                                 .metaBytes = es.metaBytes,
                                 .payloadBytes = es.payloadBytes},
                                {ReduceOp::kSum, ddst.get(), false}, ddst.get(), stream()),
              nullptr);
    EXPECT_STREQ(dev->takeError(stream()), c.reason);
    EXPECT_TRUE(guardIntact(ddst.download(), 0)) << "a rejected chunk changed the destination";
    EXPECT_EQ(dev->takeError(stream()), nullptr) << "takeError clears the status";
  }
}

TEST_F(GpuCodec, CallsOnlyEnqueueWork) {
  // Global-mode stream capture fails any call that would synchronize (cudaMalloc, cudaMemcpy,
  // cudaStreamSynchronize...): encode, decode-reduce and hops must be capturable.
  for (const char* text : {"int8", "bf16", "topk:0.01", "raw"}) {
    const CodecSpec spec = CodecSpec::parse(text);
    auto dev = DeviceCodec::create(spec);
    const size_t n = 100003, bytes = 4 * n;
    const size_t maxOut = makeCodec(spec)->maxEncodedBytes(DataType::kFloat32, n);
    DeviceBuffer dx(bytes), dout(maxOut), dout2(maxOut), dacc(bytes), scratch(bytes);
    const auto x = randomData(DataType::kFloat32, n, 1, false);
    dx.upload(x.data(), bytes);
    dacc.upload(x.data(), bytes);
    // Warm-up outside the capture: top-k's workspace is allocated on first use.
    const EncodedSize es = dev->encode(DataType::kFloat32, dx.get(), n, dout.get(), 1, stream());
    EncodedSize written{};
    ASSERT_EQ(dev->decodeReduceEncode({.codec = static_cast<uint8_t>(spec.id),
                                       .dtype = DataType::kFloat32,
                                       .count = n,
                                       .bytes = dout.get(),
                                       .metaBytes = es.metaBytes,
                                       .payloadBytes = es.payloadBytes},
                                      {ReduceOp::kSum, dacc.get()}, dout2.get(), 1, scratch.get(),
                                      stream(), &written),
              nullptr);
    ASSERT_EQ(dev->takeError(stream()), nullptr);
    ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    dev->encode(DataType::kFloat32, dx.get(), n, dout.get(), 2, stream());
    const char* why = dev->decodeReduce({.codec = static_cast<uint8_t>(spec.id),
                                         .dtype = DataType::kFloat32,
                                         .count = n,
                                         .bytes = dout.get(),
                                         .metaBytes = es.metaBytes,
                                         .payloadBytes = es.payloadBytes},
                                        {ReduceOp::kSum, dacc.get(), false}, dacc.get(), stream());
    const char* why2 = dev->decodeReduceEncode({.codec = static_cast<uint8_t>(spec.id),
                                                .dtype = DataType::kFloat32,
                                                .count = n,
                                                .bytes = dout.get(),
                                                .metaBytes = es.metaBytes,
                                                .payloadBytes = es.payloadBytes},
                                               {ReduceOp::kSum, dacc.get()}, dout2.get(), 2,
                                               scratch.get(), stream(), &written);
    cudaGraph_t graph = nullptr;
    const cudaError_t captured = cudaStreamEndCapture(stream_, &graph);
    ASSERT_EQ(captured, cudaSuccess)
        << text << ": a call synchronized during capture: " << cudaGetErrorString(captured);
    EXPECT_EQ(why, nullptr);
    EXPECT_EQ(why2, nullptr);
    cudaGraphExec_t exec = nullptr;
    ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    ASSERT_CUDA(cudaGraphLaunch(exec, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST_F(GpuCodec, PointersAreClassified) {
  void* d = nullptr;
  void* h = nullptr;
  void* m = nullptr;
  ASSERT_CUDA(cudaMalloc(&d, 64));
  ASSERT_CUDA(cudaMallocHost(&h, 64));
  ASSERT_CUDA(cudaMallocManaged(&m, 64));
  std::vector<float> plain(16);
  EXPECT_EQ(locateBuffer(d), BufferLocation::kDevice);
  EXPECT_EQ(locateBuffer(static_cast<uint8_t*>(d) + 8), BufferLocation::kDevice);
  EXPECT_EQ(locateBuffer(h), BufferLocation::kPinnedHost);
  EXPECT_EQ(locateBuffer(m), BufferLocation::kManaged);
  EXPECT_EQ(locateBuffer(plain.data()), BufferLocation::kHost);
  cudaFree(d);
  cudaFreeHost(h);
  cudaFree(m);
}

}  // namespace
}  // namespace gs::codecs
