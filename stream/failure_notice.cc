#include "stream/failure_notice.h"

#include <algorithm>
#include <cstring>

namespace gs::stream {
namespace {

constexpr uint32_t kNoticeMagic = 0x4e465347;  // "GSFN"
constexpr uint16_t kNoticeVersion = 2;         // 2: senderCompleted

// Little-endian on the wire like the chunk header: every supported host is.
struct NoticeHeader {
  uint32_t magic;
  uint16_t version;
  int16_t code;
  int32_t origin;
  int32_t detector;
  uint32_t causeBytes;
  uint32_t senderCompleted;
};
static_assert(sizeof(NoticeHeader) == 24);

bool isFailure(int code) {
  return code <= static_cast<int>(Errc::kInvalidArgument) &&
         code >= static_cast<int>(Errc::kInternal);
}

}  // namespace

size_t encodeNotice(const FailureNotice& notice, uint8_t* buf, size_t capacity) {
  if (capacity < sizeof(NoticeHeader))
    return 0;
  const size_t causeBytes =
      std::min({notice.cause.size(), kMaxNoticeCause, capacity - sizeof(NoticeHeader)});
  NoticeHeader h{kNoticeMagic,          kNoticeVersion,  static_cast<int16_t>(notice.code),
                 notice.origin,         notice.detector, static_cast<uint32_t>(causeBytes),
                 notice.senderCompleted};
  memcpy(buf, &h, sizeof(h));
  memcpy(buf + sizeof(h), notice.cause.data(), causeBytes);
  return sizeof(h) + causeBytes;
}

std::optional<FailureNotice> decodeNotice(const uint8_t* buf, size_t length, int nranks) {
  NoticeHeader h;
  if (length < sizeof(h))
    return std::nullopt;
  memcpy(&h, buf, sizeof(h));
  if (h.magic != kNoticeMagic || h.version != kNoticeVersion || !isFailure(h.code) ||
      h.origin < 0 || h.origin >= nranks || h.detector < 0 || h.detector >= nranks ||
      h.causeBytes > kMaxNoticeCause || h.causeBytes > length - sizeof(h)) {
    return std::nullopt;
  }
  FailureNotice n;
  n.code = static_cast<Errc>(h.code);
  n.origin = h.origin;
  n.detector = h.detector;
  n.senderCompleted = h.senderCompleted;
  n.cause.assign(reinterpret_cast<const char*>(buf + sizeof(h)), h.causeBytes);
  for (char& c : n.cause) {
    if (c < 0x20 || c > 0x7e)
      c = '?';
  }
  return n;
}

}  // namespace gs::stream
