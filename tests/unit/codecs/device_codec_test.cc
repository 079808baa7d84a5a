// DeviceCodec's host side: sizes equal the CPU codecs', the factory's behaviour without a device
// (or without CUDA), and pointer classification of host memory. Kernel output is compared with
// the CPU codecs in tests/gpu (label gpu).
#include "codecs/device_codec.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"

namespace gs::codecs {
namespace {

const char* const kSpecs[] = {"raw",      "fp16",  "bf16,sr",       "fp8e4m3",         "fp8e5m2,sr",
                              "int8",     "int4",  "int4,block=24", "int8,block=4096", "topk:0.01",
                              "topk:0.3", "topk:1"};

TEST(DeviceCodecSizes, EqualTheCpuEncodersSizes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (const char* text : kSpecs) {
    const CodecSpec spec = CodecSpec::parse(text);
    const auto cpu = makeCodec(spec);
    for (DataType t :
         {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{100003}}) {
        std::vector<uint8_t> src(n * elementSize(t));
        for (size_t i = 0; i < n; ++i) {
          const float f = normal(rng);
          if (t == DataType::kFloat64) {
            const double d = f;
            memcpy(src.data() + 8 * i, &d, 8);
          } else if (t == DataType::kFloat32) {
            memcpy(src.data() + 4 * i, &f, 4);
          } else {
            uint16_t h = 0x3c00;  // 1.0 in fp16; any finite bits do for sizes
            memcpy(src.data() + 2 * i, &h, 2);
          }
        }
        std::vector<uint8_t> out(cpu->maxEncodedBytes(t, n) + 1);
        const EncodedSize want = cpu->encode(t, src.data(), n, out.data(), 1);
        const EncodedSize got = DeviceCodec::encodedSize(spec, t, n);
        EXPECT_EQ(got.metaBytes, want.metaBytes) << text << " " << dataTypeName(t) << " n=" << n;
        EXPECT_EQ(got.payloadBytes, want.payloadBytes)
            << text << " " << dataTypeName(t) << " n=" << n;
        EXPECT_LE(size_t{got.metaBytes} + got.payloadBytes, cpu->maxEncodedBytes(t, n));
      }
    }
  }
}

TEST(DeviceCodecFactory, WithoutADeviceSaysWhyAndOtherwiseCreates) {
  const char* why = deviceUnavailableReason();
  if (why != nullptr) {
    try {
      DeviceCodec::create(CodecSpec::parse("int8"));
      FAIL() << "create() succeeded although no device is usable: " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  } else {
    EXPECT_NE(DeviceCodec::create(CodecSpec::parse("int8")), nullptr);
  }
  // An invalid spec is an invalid argument whether or not a device exists.
  CodecSpec bad = CodecSpec::parse("int8");
  bad.blockSize = 12;
  try {
    DeviceCodec::create(bad);
    FAIL() << "block size 12 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidArgument) << e.what();
  }
}

TEST(DeviceCodecFactory, HostMemoryIsHost) {
  std::vector<float> v(16);
  EXPECT_EQ(locateBuffer(v.data()), BufferLocation::kHost);
  EXPECT_EQ(locateBuffer(nullptr), BufferLocation::kHost);
  EXPECT_STREQ(bufferLocationName(BufferLocation::kDevice), "device");
}

}  // namespace
}  // namespace gs::codecs
