#pragma once

// What the staging tests share: communicators of one process (threads, real rendezvous, tcp over
// 127.0.0.1) on one FakeDeviceMemory, inputs, and a fake stream held by a running "kernel".
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "control/bootstrap.h"
#include "control/communicator.h"
#include "fake_device_memory.h"
#include "staging_inputs.h"

namespace gs::control::staging_test {

using gs::testing::FakeDeviceMemory;
using gs::testing::gradient;
using gs::testing::inputValue;
using stream::CollectiveArgs;
using stream::CollectiveKind;
using Stream = codecs::DeviceMemory::Stream;

struct Options {
  int64_t stagingBytes = 64 << 10;  // the smallest slots: many pieces per call
  int64_t timeoutMs = 20000;
  std::string codec = "raw";
  std::string transport = "tcp";
  bool shm = false;  // same-host links over shared memory instead of the transport
};

// Runs body(rank, comm) on nranks communicators sharing one fake device; returns each rank's
// error ("" when it succeeded).
inline std::vector<std::string> runRanks(int nranks,
                                         const std::shared_ptr<FakeDeviceMemory>& fake,
                                         const Options& opt,
                                         const std::function<void(int, Communicator&)>& body) {
  Config cfg;
  cfg.transport = opt.transport;
  cfg.shm = opt.shm;
  cfg.timeoutMs = opt.timeoutMs;
  cfg.stagingBytes = opt.stagingBytes;
  cfg.codec = opt.codec;
  cfg.chunkBytes = 16 << 10;
  const UniqueId id = createUniqueId(cfg);
  std::vector<std::string> errors(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = Communicator::create(nranks, id, r, cfg);
        comm->setDeviceMemory(fake);
        body(r, *comm);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return errors;
}

inline void expectAllOk(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    EXPECT_EQ(errors[r], "") << "rank " << r;
}

inline CollectiveArgs argsOf(CollectiveKind kind, const void* send, void* recv, size_t count) {
  CollectiveArgs a;
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = DataType::kFloat32;
  a.op = ReduceOp::kSum;
  return a;
}

// Copies between fake device memory and the host, ordered on the stream.
inline void toDevice(FakeDeviceMemory& fake, void* dev, const std::vector<float>& host, Stream s) {
  fake.copy2D(dev, 0, host.data(), 0, host.size() * 4, 1, s);
}
inline std::vector<float> fromDevice(FakeDeviceMemory& fake, const void* dev, size_t n, Stream s) {
  std::vector<float> host(n);
  fake.copy2D(host.data(), 0, dev, 0, n * 4, 1, s);
  fake.synchronize(s);
  return host;
}

class FakeDeviceStaging : public ::testing::Test {
 protected:
  std::shared_ptr<FakeDeviceMemory> fake_ = std::make_shared<FakeDeviceMemory>();
  void TearDown() override {
    for (const auto& e : fake_->errors())
      ADD_FAILURE() << e;
  }
};

// A stream held by an op that waits until released (10 s at most: tests never hang), and a
// device buffer. Leaving the scope, also by an exception, releases and drains the stream and
// frees the buffer.
struct HeldStream {
  FakeDeviceMemory& fake;
  Stream stream = fake.createStream();
  void* buffer = fake.allocDevice(4096);
  std::atomic<bool> release{false};
  explicit HeldStream(FakeDeviceMemory& f, bool hold = true) : fake(f) {
    if (!hold)
      return;
    fake.enqueue(stream, [this] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!release.load() && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  ~HeldStream() {
    release = true;
    fake.synchronize(stream);
    fake.freeDevice(buffer);
  }
};

}  // namespace gs::control::staging_test
