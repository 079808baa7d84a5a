// DeviceCodec: host-side checks and sizes, then the kernels/ launchers. Without CUDA
// (GS_HAVE_CUDA 0) the factory reports kUnsupported and buffers are always host buffers.
#include "codecs/device_codec.h"

#include "codecs/topk_keep.h"
#include "common/error.h"
#include "format/block_math.h"
#include "gradstream/build_config.h"

#if GS_HAVE_CUDA
#include "kernels/launch.h"
#endif

namespace gs::codecs {

using format::CodecId;

const char* bufferLocationName(BufferLocation location) {
  switch (location) {
    case BufferLocation::kHost:
      return "host";
    case BufferLocation::kPinnedHost:
      return "pinned host";
    case BufferLocation::kDevice:
      return "device";
    case BufferLocation::kManaged:
      return "managed";
  }
  return "unknown";
}

EncodedSize DeviceCodec::encodedSize(const CodecSpec& spec, DataType dtype, size_t count) {
  switch (spec.id) {
    case CodecId::kRaw:
      return {0, static_cast<uint32_t>(count * elementSize(dtype))};
    case CodecId::kFp16:
    case CodecId::kBf16:
      return {0, static_cast<uint32_t>(2 * count)};
    case CodecId::kTopK: {
      const uint64_t k = topkKeep(spec.topkFraction, dtype, count);
      return {static_cast<uint32_t>(4 * k), static_cast<uint32_t>(4 * k)};
    }
    default: {
      const uint64_t nblocks = (count + spec.blockSize - 1) / spec.blockSize;
      const uint64_t payload = spec.id == CodecId::kInt4 ? (count + 1) / 2 : count;
      return {static_cast<uint32_t>(4 + 4 * nblocks), static_cast<uint32_t>(payload)};
    }
  }
}

bool DeviceCodec::supports(DataType dtype) const {
  if (spec_.id == CodecId::kRaw)
    return isValid(dtype);
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat16 ||
         dtype == DataType::kBFloat16 || dtype == DataType::kFloat64;
}

#if GS_HAVE_CUDA

namespace {

// The encode half of a launch as every entry point fills it (the source, where there is one,
// is set by the caller).
kernels::EncodeArgs encodeArgs(const CodecSpec& spec,
                               DataType dtype,
                               size_t count,
                               uint8_t* out,
                               uint64_t seed,
                               const DeviceFeedback& feedback) {
  kernels::EncodeArgs a;
  a.codec = spec.id;
  a.dtype = dtype;
  a.stochastic = spec.stochastic;
  a.blockSize = spec.blockSize;
  a.topkK = spec.id == CodecId::kTopK ? topkKeep(spec.topkFraction, dtype, count) : 0;
  a.count = count;
  a.out = out;
  a.srKey = format::math::srKey(seed);
  a.decodedOut = feedback.decoded;
  a.residualOut = feedback.residual;
  a.residualFactor = feedback.residualFactor;
  return a;
}

// The decode half of a launch: what arrived and how many elements it holds.
kernels::DecodeArgs decodeArgs(const EncodedChunk& in) {
  kernels::DecodeArgs a;
  a.codec = static_cast<CodecId>(in.codec);
  a.dtype = in.dtype;
  a.in = in.bytes;
  a.metaBytes = in.metaBytes;
  a.payloadBytes = in.payloadBytes;
  a.count = in.count;
  return a;
}

const char* checkSizes(const EncodedChunk& in) {
  return checkEncodedSizes(in.codec, in.dtype, in.count, in.metaBytes, in.payloadBytes);
}

}  // namespace

struct DeviceCodec::State {
  kernels::Workspace workspace;
};

const char* deviceUnavailableReason() {
  return kernels::deviceUnavailableReason();
}

BufferLocation locateBuffer(const void* p) {
  switch (kernels::classifyPointer(p)) {
    case kernels::MemoryKind::kHost:
      return BufferLocation::kHost;
    case kernels::MemoryKind::kPinnedHost:
      return BufferLocation::kPinnedHost;
    case kernels::MemoryKind::kDevice:
      return BufferLocation::kDevice;
    case kernels::MemoryKind::kManaged:
      return BufferLocation::kManaged;
  }
  return BufferLocation::kHost;
}

std::unique_ptr<DeviceCodec> DeviceCodec::create(const CodecSpec& spec) {
  makeCodec(spec);  // validates the spec exactly as the CPU factory does
  const char* why = deviceUnavailableReason();
  GS_CHECK(why == nullptr, Errc::kUnsupported, "device codecs need a CUDA device: %s", why);
  return std::unique_ptr<DeviceCodec>(new DeviceCodec(spec, std::make_unique<State>()));
}

DeviceCodec::DeviceCodec(const CodecSpec& spec, std::unique_ptr<State> state)
    : spec_(spec), state_(std::move(state)) {}
DeviceCodec::~DeviceCodec() = default;

EncodedSize DeviceCodec::encode(DataType dtype,
                                const void* src,
                                size_t count,
                                uint8_t* out,
                                uint64_t seed,
                                CUstream_st* stream,
                                const DeviceFeedback& feedback) {
  GS_CHECK(supports(dtype), Errc::kInvalidArgument, "codec %s cannot encode %s (use raw)",
           codecIdName(spec_.id), dataTypeName(dtype));
  kernels::EncodeArgs a = encodeArgs(spec_, dtype, count, out, seed, feedback);
  a.src = src;
  kernels::launchEncode(a, state_->workspace, stream);
  return encodedSize(dtype, count);
}

const char* DeviceCodec::decode(const EncodedChunk& in, void* dst, CUstream_st* stream) {
  if (const char* why = checkSizes(in))
    return why;
  kernels::DecodeArgs a = decodeArgs(in);
  a.dst = dst;
  kernels::launchDecode(a, state_->workspace, stream);
  return nullptr;
}

const char* DeviceCodec::decodeReduce(const EncodedChunk& in,
                                      const Reduction& reduction,
                                      void* dst,
                                      CUstream_st* stream) {
  if (const char* why = checkSizes(in))
    return why;
  if (!isValid(reduction.op))
    return "invalid reduction op";
  kernels::DecodeArgs a = decodeArgs(in);
  a.reduce = true;
  a.op = reduction.op;
  a.incomingFirst = reduction.incomingFirst;
  a.operand = reduction.operand;
  a.dst = dst;
  kernels::launchDecode(a, state_->workspace, stream);
  return nullptr;
}

const char* DeviceCodec::decodeReduceEncode(const EncodedChunk& in,
                                            const Reduction& reduction,
                                            uint8_t* out,
                                            uint64_t seed,
                                            void* scratch,
                                            CUstream_st* stream,
                                            EncodedSize* written,
                                            const DeviceFeedback& feedback) {
  if (const char* why = checkSizes(in))
    return why;
  if (!isValid(reduction.op))
    return "invalid reduction op";
  GS_CHECK(supports(in.dtype), Errc::kInvalidArgument, "codec %s cannot encode %s (use raw)",
           codecIdName(spec_.id), dataTypeName(in.dtype));
  kernels::DecodeArgs d = decodeArgs(in);
  d.reduce = true;
  d.op = reduction.op;
  d.operand = reduction.operand;
  const kernels::EncodeArgs e = encodeArgs(spec_, in.dtype, in.count, out, seed, feedback);
  kernels::launchDecodeReduceEncode(d, e, scratch, state_->workspace, stream);
  *written = encodedSize(in.dtype, in.count);
  return nullptr;
}

const char* DeviceCodec::takeError(CUstream_st* stream) {
  return state_->workspace.takeError(stream);
}

#else  // !GS_HAVE_CUDA

struct DeviceCodec::State {};

const char* deviceUnavailableReason() {
  return "this build of gradstream has no CUDA support (configure with -DGS_WITH_CUDA=ON)";
}

BufferLocation locateBuffer(const void*) {
  return BufferLocation::kHost;
}

std::unique_ptr<DeviceCodec> DeviceCodec::create(const CodecSpec& spec) {
  makeCodec(spec);
  GS_CHECK(false, Errc::kUnsupported, "device codecs: %s", deviceUnavailableReason());
  return nullptr;
}

DeviceCodec::~DeviceCodec() = default;

// Never called: no instance exists without CUDA.
EncodedSize DeviceCodec::encode(
    DataType, const void*, size_t, uint8_t*, uint64_t, CUstream_st*, const DeviceFeedback&) {
  GS_CHECK(false, Errc::kUnsupported, "%s", deviceUnavailableReason());
  return {};
}
const char* DeviceCodec::decode(const EncodedChunk&, void*, CUstream_st*) {
  return deviceUnavailableReason();
}
const char* DeviceCodec::decodeReduce(const EncodedChunk&, const Reduction&, void*, CUstream_st*) {
  return deviceUnavailableReason();
}
const char* DeviceCodec::decodeReduceEncode(const EncodedChunk&,
                                            const Reduction&,
                                            uint8_t*,
                                            uint64_t,
                                            void*,
                                            CUstream_st*,
                                            EncodedSize*,
                                            const DeviceFeedback&) {
  return deviceUnavailableReason();
}
const char* DeviceCodec::takeError(CUstream_st*) {
  return nullptr;
}

#endif  // GS_HAVE_CUDA

}  // namespace gs::codecs
