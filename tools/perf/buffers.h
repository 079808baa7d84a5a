#pragma once

// Where gradstream-perf's send and receive buffers live: host memory (--device host) or CUDA
// device memory (--device cuda). The benchmark addresses both kinds through host pointers: for
// host buffers they are the buffers themselves; for device buffers they are a host mirror of the
// same size, filled and checked on the host and copied to and from the device outside the timed
// region, and forCollective() maps a mirror address to the device address at the same offset.
// That keeps one benchmark loop and one result check for both kinds.
//
// One object per rank process; it owns its memory (and, for device buffers, a CUDA stream).
// Not thread-safe: the thread that runs the collectives uses it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct CUstream_st;

class Buffers {
 public:
  virtual ~Buffers() = default;

  /// Host views of the receive and send regions (send is empty, nullptr, when in place).
  virtual uint8_t* recv() = 0;
  virtual uint8_t* send() = 0;
  /// The address the collectives get for host view p: p itself, or the device address.
  virtual void* forCollective(const uint8_t* p) = 0;
  /// The stream the collectives get (nullptr for host buffers).
  virtual CUstream_st* stream() = 0;
  /// Copies `bytes` at host view p to the device and waits for the copy (nothing for host).
  virtual void upload(const uint8_t* p, size_t bytes) = 0;
  /// Waits for the collectives enqueued so far, then copies `bytes` at p's device address into
  /// the host view (nothing for host buffers).
  virtual void download(uint8_t* p, size_t bytes) = 0;
  /// Waits until the stream has finished the collectives enqueued on it (nothing for host
  /// buffers, whose collectives return with the result in place).
  virtual void synchronize() = 0;
  /// Whether the collectives get device memory.
  virtual bool isDevice() const = 0;
  /// For the header line: "host", "cuda device N".
  virtual std::string describe() const = 0;
};

/// Zero-filled host buffers of the given sizes.
std::unique_ptr<Buffers> makeHostBuffers(size_t recvBytes, size_t sendBytes);

/// "" when --device cuda can run here; otherwise why not, for the user: a build without CUDA,
/// or cudaGetDeviceCount's error (no driver, no device).
std::string cudaUnavailableReason();

/// Zero-filled device buffers on device localRank % (device count), with one stream created for
/// them. Throws std::runtime_error naming the CUDA call that failed and its error string.
std::unique_ptr<Buffers> makeCudaBuffers(int localRank, size_t recvBytes, size_t sendBytes);
