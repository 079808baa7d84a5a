#pragma once

#include <cstddef>
#include <memory>

namespace gs::transport {

/// Fixed-capacity FIFO whose storage is allocated once, at construction, so pushing and
/// popping on the data path never allocate. Not thread-safe; T must be default-constructible.
template <class T>
class Ring {
 public:
  explicit Ring(size_t capacity = 0)
      : slots_(new T[capacity ? capacity : 1]), capacity_(capacity) {}

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  bool full() const { return size_ == capacity_; }
  size_t room() const { return capacity_ - size_; }

  /// Appends; false (and nothing changes) when full.
  bool push(const T& value) {
    if (full())
      return false;
    slots_[(head_ + size_) % capacity_] = value;
    ++size_;
    return true;
  }
  T& front() { return slots_[head_]; }
  /// The i-th element from the front (i < size()).
  T& at(size_t i) { return slots_[(head_ + i) % capacity_]; }
  void pop() {
    head_ = (head_ + 1) % capacity_;
    --size_;
  }
  void clear() {
    head_ = 0;
    size_ = 0;
  }

 private:
  std::unique_ptr<T[]> slots_;
  size_t capacity_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace gs::transport
