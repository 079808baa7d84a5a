// CodecSpec::parse / name: the codec names users write in gs_config_t.codec and GS_CODEC.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "codecs/codec.h"
#include "common/error.h"

namespace gs::codecs {

using format::CodecId;
using format::kNumCodecIds;

namespace {

constexpr const char* kKnown = "raw, fp16, bf16, fp8e4m3, fp8e5m2, int8, int4, topk:<fraction>";

bool isBlockCodec(CodecId id) {
  return id == CodecId::kFp8E4M3 || id == CodecId::kFp8E5M2 || id == CodecId::kInt8 ||
         id == CodecId::kInt4;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return s.substr(b, e - b);
}

}  // namespace

const char* codecIdName(CodecId id) {
  switch (id) {
    case CodecId::kRaw:
      return "raw";
    case CodecId::kFp16:
      return "fp16";
    case CodecId::kBf16:
      return "bf16";
    case CodecId::kFp8E4M3:
      return "fp8e4m3";
    case CodecId::kFp8E5M2:
      return "fp8e5m2";
    case CodecId::kInt8:
      return "int8";
    case CodecId::kInt4:
      return "int4";
    case CodecId::kTopK:
      return "topk";
  }
  return "unknown";
}

CodecSpec CodecSpec::parse(const std::string& text) {
  CodecSpec spec;
  std::string all;
  for (char c : trim(text))
    all += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t comma = all.find(',');
  std::string head = trim(all.substr(0, comma));
  std::string arg;
  bool hasArg = false;
  if (size_t colon = head.find(':'); colon != std::string::npos) {
    arg = trim(head.substr(colon + 1));
    head = trim(head.substr(0, colon));
    hasArg = true;
  }
  bool found = false;
  for (int i = 0; i < kNumCodecIds; ++i) {
    if (head == codecIdName(static_cast<CodecId>(i))) {
      spec.id = static_cast<CodecId>(i);
      found = true;
    }
  }
  GS_CHECK(found, Errc::kInvalidArgument, "codec '%s' is unknown (%s)", text.c_str(), kKnown);
  if (spec.id == CodecId::kTopK) {
    GS_CHECK(hasArg && !arg.empty(), Errc::kInvalidArgument,
             "codec '%s': topk needs a fraction of elements to keep, e.g. topk:0.01", text.c_str());
    char* end = nullptr;
    errno = 0;
    const double f = std::strtod(arg.c_str(), &end);
    GS_CHECK(errno == 0 && end != arg.c_str() && *end == '\0' && f > 0 && f <= 1,
             Errc::kInvalidArgument, "codec '%s': topk fraction '%s' must be a number in (0, 1]",
             text.c_str(), arg.c_str());
    spec.topkFraction = static_cast<float>(f);
  } else {
    GS_CHECK(!hasArg, Errc::kInvalidArgument, "codec '%s': '%s' takes no ':' argument",
             text.c_str(), head.c_str());
  }
  while (comma != std::string::npos) {
    const size_t next = all.find(',', comma + 1);
    const std::string opt = trim(
        all.substr(comma + 1, next == std::string::npos ? std::string::npos : next - comma - 1));
    comma = next;
    if (opt == "sr") {
      GS_CHECK(spec.id != CodecId::kRaw && spec.id != CodecId::kTopK, Errc::kInvalidArgument,
               "codec '%s': option 'sr' (stochastic rounding) does not apply to %s", text.c_str(),
               codecIdName(spec.id));
      spec.stochastic = true;
    } else if (opt.rfind("block=", 0) == 0) {
      GS_CHECK(isBlockCodec(spec.id), Errc::kInvalidArgument,
               "codec '%s': option 'block' applies only to fp8e4m3, fp8e5m2, int8 and int4",
               text.c_str());
      const std::string v = opt.substr(6);
      char* end = nullptr;
      errno = 0;
      const unsigned long n = std::strtoul(v.c_str(), &end, 10);
      GS_CHECK(errno == 0 && !v.empty() && std::isdigit(static_cast<unsigned char>(v[0])) &&
                   *end == '\0' && n >= 8 && n <= 65536 && n % 8 == 0,
               Errc::kInvalidArgument,
               "codec '%s': block size '%s' must be a multiple of 8 in [8, 65536]", text.c_str(),
               v.c_str());
      spec.blockSize = static_cast<uint32_t>(n);
    } else {
      GS_CHECK(false, Errc::kInvalidArgument, "codec '%s': unknown option '%s' (sr, block=N)",
               text.c_str(), opt.c_str());
    }
  }
  return spec;
}

std::string CodecSpec::name() const {
  std::string s = codecIdName(id);
  if (id == CodecId::kTopK)
    s += formatString(":%g", static_cast<double>(topkFraction));
  if (stochastic)
    s += ",sr";
  if (isBlockCodec(id) && blockSize != 256)
    s += formatString(",block=%u", blockSize);
  return s;
}

}  // namespace gs::codecs
