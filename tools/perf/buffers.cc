#include "perf/buffers.h"

#include <vector>

namespace {

// Host buffers: the host views are the buffers, and the collectives return with the result in
// place, so there is nothing to copy or wait for.
class HostBuffers final : public Buffers {
 public:
  HostBuffers(size_t recvBytes, size_t sendBytes) : recv_(recvBytes), send_(sendBytes) {}

  uint8_t* recv() override { return recv_.data(); }
  uint8_t* send() override { return send_.data(); }
  void* forCollective(const uint8_t* p) override { return const_cast<uint8_t*>(p); }
  CUstream_st* stream() override { return nullptr; }
  void upload(const uint8_t*, size_t) override {}
  void download(uint8_t*, size_t) override {}
  void synchronize() override {}
  bool isDevice() const override { return false; }
  std::string describe() const override { return "host"; }

 private:
  std::vector<uint8_t> recv_;
  std::vector<uint8_t> send_;
};

}  // namespace

std::unique_ptr<Buffers> makeHostBuffers(size_t recvBytes, size_t sendBytes) {
  return std::make_unique<HostBuffers>(recvBytes, sendBytes);
}
