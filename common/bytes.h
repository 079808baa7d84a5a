#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"

namespace gs {

/// Appends little-endian fields to a byte vector (set-up messages, not the data path).
class ByteWriter {
 public:
  template <class T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void putBytes(std::span<const uint8_t> bytes) {
    put(static_cast<uint32_t>(bytes.size()));
    out_.insert(out_.end(), bytes.begin(), bytes.end());
  }
  void putString(const std::string& s) {
    putBytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

/// Reads what ByteWriter wrote, checking every length against what is left: the bytes may come
/// from the network. A short or oversized field throws kRemote naming `what`.
class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> in, std::string what) : in_(in), what_(std::move(what)) {}

  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T value;
    memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::vector<uint8_t> getBytes(size_t maxLength) {
    const auto n = get<uint32_t>();
    GS_CHECK(n <= maxLength, Errc::kRemote, "%s: field of %u bytes exceeds %zu", what_.c_str(), n,
             maxLength);
    need(n);
    std::vector<uint8_t> out(in_.begin() + static_cast<long>(pos_),
                             in_.begin() + static_cast<long>(pos_ + n));
    pos_ += n;
    return out;
  }
  std::string getString(size_t maxLength) {
    auto b = getBytes(maxLength);
    return std::string(b.begin(), b.end());
  }
  bool atEnd() const { return pos_ == in_.size(); }

 private:
  void need(size_t n) const {
    GS_CHECK(in_.size() - pos_ >= n, Errc::kRemote, "%s: truncated message", what_.c_str());
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace gs
