// The C API: argument checks, then control/. Exceptions become status codes in guard() only
// (guardStatus() is guard() for calls with more than one success status): every entry point's
// body runs inside one, so nothing throws across the C boundary.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "common/types.h"
#include "control/bootstrap.h"
#include "control/communicator.h"
#include "control/gradient_stream.h"
#include "control/launch_env.h"
#include "control/unique_id.h"
#include "gradstream/build_config.h"
#include "gradstream/gradstream.h"

struct gs_comm_s {
  std::unique_ptr<gs::control::Communicator> comm;
};

struct gs_stream_s {
  std::unique_ptr<gs::control::GradientStream> stream;
  int64_t timeoutMs;
};

struct gs_request_s {
  std::shared_ptr<gs::control::Request> request;
  int64_t timeoutMs;
};

namespace {

using gs::Errc;

#define GS_SAME(c, e) static_assert(static_cast<int>(c) == static_cast<int>(e), #c)
GS_SAME(GS_OK, Errc::kOk);
GS_SAME(GS_IN_PROGRESS, Errc::kInProgress);
GS_SAME(GS_ERR_INVALID_ARGUMENT, Errc::kInvalidArgument);
GS_SAME(GS_ERR_UNSUPPORTED, Errc::kUnsupported);
GS_SAME(GS_ERR_NO_MEMORY, Errc::kNoMemory);
GS_SAME(GS_ERR_SYSTEM, Errc::kSystem);
GS_SAME(GS_ERR_REMOTE, Errc::kRemote);
GS_SAME(GS_ERR_TIMEOUT, Errc::kTimeout);
GS_SAME(GS_ERR_ABORTED, Errc::kAborted);
GS_SAME(GS_ERR_INTERNAL, Errc::kInternal);
GS_SAME(GS_FLOAT32, gs::DataType::kFloat32);
GS_SAME(GS_FLOAT16, gs::DataType::kFloat16);
GS_SAME(GS_BFLOAT16, gs::DataType::kBFloat16);
GS_SAME(GS_FLOAT64, gs::DataType::kFloat64);
GS_SAME(GS_INT32, gs::DataType::kInt32);
GS_SAME(GS_INT64, gs::DataType::kInt64);
GS_SAME(GS_UINT8, gs::DataType::kUInt8);
GS_SAME(GS_SUM, gs::ReduceOp::kSum);
GS_SAME(GS_AVG, gs::ReduceOp::kAvg);
GS_SAME(GS_MIN, gs::ReduceOp::kMin);
GS_SAME(GS_MAX, gs::ReduceOp::kMax);
GS_SAME(GS_PROD, gs::ReduceOp::kProd);
static_assert(sizeof(gs_unique_id_t) == gs::control::UniqueId::kBytes, "unique id size");

thread_local std::string tLastError;

void setLastError(const char* message) noexcept {
  try {
    tLastError = message;
  } catch (...) {
    tLastError.clear();  // no memory for the message: the status still says what happened
  }
  GS_LOG_DEBUG("returning error: %s", message);
}

template <class F>
gs_status_t guard(F&& f) noexcept {
  try {
    std::forward<F>(f)();
    return GS_OK;
  } catch (const gs::Error& e) {
    setLastError(e.what());
    return static_cast<gs_status_t>(e.code());
  } catch (const std::bad_alloc&) {
    setLastError("out of memory");
    return GS_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    setLastError(e.what());
    return GS_ERR_INTERNAL;
  } catch (...) {
    setLastError("unknown exception");
    return GS_ERR_INTERNAL;
  }
}

// guard() for calls with more than one success status (GS_IN_PROGRESS, a request's own): f
// returns the status; whatever it throws becomes one, as in guard().
template <class F>
gs_status_t guardStatus(F&& f) noexcept {
  gs_status_t status = GS_OK;
  const gs_status_t thrown = guard([&] { status = std::forward<F>(f)(); });
  return thrown != GS_OK ? thrown : status;
}

#define GS_ARG(cond, ...) GS_CHECK(cond, ::gs::Errc::kInvalidArgument, __VA_ARGS__)

// Library configuration: defaults, then the caller's struct, then the environment.
gs::Config makeConfig(const gs_config_t* c) {
  gs::Config cfg;
  if (c != nullptr) {
    GS_ARG(c->struct_size >= offsetof(gs_config_t, transport) + sizeof(c->transport),
           "config->struct_size %zu is too small (call gs_config_init)", c->struct_size);
    auto has = [&](size_t offset, size_t size) { return c->struct_size >= offset + size; };
#define GS_FIELD(f) has(offsetof(gs_config_t, f), sizeof(c->f))
    if (GS_FIELD(transport) && c->transport)
      cfg.transport = c->transport;
    if (GS_FIELD(timeout_ms) && c->timeout_ms >= 0)
      cfg.timeoutMs = c->timeout_ms;
    if (GS_FIELD(chunk_bytes) && c->chunk_bytes >= 0)
      cfg.chunkBytes = c->chunk_bytes;
    if (GS_FIELD(codec) && c->codec)
      cfg.codec = c->codec;
    if (GS_FIELD(metrics_address) && c->metrics_address)
      cfg.metricsAddress = c->metrics_address;
    if (GS_FIELD(slots_per_peer) && c->slots_per_peer >= 0)
      cfg.slotsPerPeer = c->slots_per_peer;
    if (GS_FIELD(sockets_per_peer) && c->sockets_per_peer >= 0)
      cfg.socketsPerPeer = c->sockets_per_peer;
    if (GS_FIELD(codec_ladder) && c->codec_ladder)
      cfg.codecLadder = c->codec_ladder;
    if (GS_FIELD(codec_floor) && c->codec_floor)
      cfg.codecFloor = c->codec_floor;
    if (GS_FIELD(chunk_min_bytes) && c->chunk_min_bytes >= 0)
      cfg.chunkMinBytes = c->chunk_min_bytes;
    if (GS_FIELD(chunk_max_bytes) && c->chunk_max_bytes >= 0)
      cfg.chunkMaxBytes = c->chunk_max_bytes;
    if (GS_FIELD(error_budget) && c->error_budget >= 0)
      cfg.errorBudget = c->error_budget;
    if (GS_FIELD(algo) && c->algo)
      cfg.algo = c->algo;
    if (GS_FIELD(hostname) && c->hostname)
      cfg.hostname = c->hostname;
    if (GS_FIELD(shm) && c->shm >= 0)
      cfg.shm = c->shm != 0;
    if (GS_FIELD(staging_bytes) && c->staging_bytes >= 0)
      cfg.stagingBytes = c->staging_bytes;
#undef GS_FIELD
  }
  cfg.applyEnvironment();
  cfg.validate();
  gs::setLogLevel(cfg.logLevel);
  return cfg;
}

void checkApiVersion(int version) {
  GS_CHECK(version / 10000 == GS_VERSION_MAJOR, Errc::kUnsupported,
           "application built against gradstream API %d, library is %d", version, GS_API_VERSION);
}

gs::control::Communicator& communicator(gs_comm_t comm) {
  GS_ARG(comm != nullptr && comm->comm != nullptr, "comm is NULL");
  return *comm->comm;
}

// The integer a C caller passed as an enum. Read through memcpy: in C++ loading an enum object
// whose value is outside the enumerators' range is undefined, and C callers may pass anything.
template <class Enum>
int enumValue(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int));
  int v;
  memcpy(&v, &e, sizeof(v));
  return v;
}

void checkTypes(const gs_dtype_t& dtype, const gs_redop_t& op) {
  GS_ARG(enumValue(dtype) >= 0 && enumValue(dtype) < gs::kNumDataTypes,
         "dtype %d is not a gs_dtype_t", enumValue(dtype));
  GS_ARG(enumValue(op) >= 0 && enumValue(op) < gs::kNumReduceOps, "op %d is not a gs_redop_t",
         enumValue(op));
}

size_t bytesOf(size_t count, gs_dtype_t dtype, size_t times, const char* what) {
  const size_t esize = gs::elementSize(static_cast<gs::DataType>(dtype));
  GS_ARG(count <= SIZE_MAX / esize / times, "%s %zu overflows the address space", what, count);
  return count * esize * times;
}

// Buffers may be the same memory in NCCL's in-place layouts; any other overlap is an error
// (the result would depend on timing).
void checkOverlap(const void* send,
                  size_t sendBytes,
                  const void* recv,
                  size_t recvBytes,
                  const void* inPlaceSend) {
  if (send == nullptr || recv == nullptr || sendBytes == 0 || recvBytes == 0)
    return;
  auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const bool overlap = s < r + recvBytes && r < s + sendBytes;
  GS_ARG(!overlap || send == inPlaceSend,
         "sendbuff and recvbuff overlap without being in place (in place means sendbuff == %p)",
         inPlaceSend);
}

// Reduce-scatter (the send buffer holds N blocks) and allgather (the recv buffer does): NULL
// checks, size overflow, and overlap other than NCCL's in-place layout (block `rank`).
void checkBlockBuffers(const gs::control::Communicator& c,
                       const void* send,
                       void* recv,
                       size_t count,
                       gs_dtype_t dtype,
                       const char* countName,
                       bool sendIsBlocks) {
  const size_t n = static_cast<size_t>(c.size());
  const size_t block = bytesOf(count, dtype, 1, countName);
  const size_t blocks = bytesOf(count, dtype, n, countName);
  GS_ARG(count == 0 || send != nullptr, "sendbuff is NULL");
  GS_ARG(count == 0 || recv != nullptr, "recvbuff is NULL");
  const size_t own = block * static_cast<size_t>(c.rank());
  if (sendIsBlocks) {
    checkOverlap(send, blocks, recv, block, static_cast<const uint8_t*>(recv) - own);
  } else {
    checkOverlap(send, block, recv, blocks, static_cast<const uint8_t*>(recv) + own);
  }
}

gs::stream::CollectiveArgs reduceArgs(gs::stream::CollectiveKind kind,
                                      const void* send,
                                      void* recv,
                                      size_t count,
                                      gs_dtype_t dtype,
                                      gs_redop_t op) {
  gs::stream::CollectiveArgs a;
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = static_cast<gs::DataType>(dtype);
  a.op = static_cast<gs::ReduceOp>(op);
  return a;
}

// The builders take dtype and op by reference: a C caller may pass any integer, and copying an
// enum outside its range is undefined before checkTypes has looked at it through memcpy.
gs::stream::CollectiveArgs allreduceArgs(const void* send,
                                         void* recv,
                                         size_t count,
                                         const gs_dtype_t& dtype,
                                         const gs_redop_t& op,
                                         gs_comm_t comm) {
  communicator(comm);
  checkTypes(dtype, op);
  const size_t bytes = bytesOf(count, dtype, 1, "count");
  GS_ARG(count == 0 || send != nullptr, "sendbuff is NULL");
  GS_ARG(count == 0 || recv != nullptr, "recvbuff is NULL");
  checkOverlap(send, bytes, recv, bytes, recv);
  return reduceArgs(gs::stream::CollectiveKind::kAllReduce, send, recv, count, dtype, op);
}

gs::stream::CollectiveArgs reduceScatterArgs(const void* send,
                                             void* recv,
                                             size_t recvcount,
                                             const gs_dtype_t& dtype,
                                             const gs_redop_t& op,
                                             gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, op);
  checkBlockBuffers(c, send, recv, recvcount, dtype, "recvcount", true);
  return reduceArgs(gs::stream::CollectiveKind::kReduceScatter, send, recv, recvcount, dtype, op);
}

gs::stream::CollectiveArgs allgatherArgs(
    const void* send, void* recv, size_t sendcount, const gs_dtype_t& dtype, gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, GS_SUM);
  checkBlockBuffers(c, send, recv, sendcount, dtype, "sendcount", false);
  return reduceArgs(gs::stream::CollectiveKind::kAllGather, send, recv, sendcount, dtype, GS_SUM);
}

gs::stream::CollectiveArgs broadcastArgs(
    const void* send, void* recv, size_t count, const gs_dtype_t& dtype, int root, gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, GS_SUM);
  GS_ARG(root >= 0 && root < c.size(), "root %d is out of range [0, %d)", root, c.size());
  const size_t bytes = bytesOf(count, dtype, 1, "count");
  GS_ARG(count == 0 || c.rank() != root || send != nullptr, "sendbuff is NULL on the root");
  GS_ARG(count == 0 || recv != nullptr, "recvbuff is NULL");
  if (c.rank() == root)
    checkOverlap(send, bytes, recv, bytes, recv);
  auto args = reduceArgs(gs::stream::CollectiveKind::kBroadcast, send, recv, count, dtype, GS_SUM);
  args.root = root;
  return args;
}

// Blocking calls: a count of 0 checks its arguments and does nothing.
void runBlocking(gs_comm_t comm, const gs::stream::CollectiveArgs& args, CUstream_st* stream) {
  if (args.count > 0)
    communicator(comm).run(args, stream);
}

// Non-blocking calls: a request for the progress thread, or one complete at once for count 0.
void issue(gs_comm_t comm,
           const gs::stream::CollectiveArgs& args,
           CUstream_st* stream,
           gs_request_t* out_request) {
  GS_ARG(out_request != nullptr, "out_request is NULL");
  auto& c = communicator(comm);
  auto handle = std::make_unique<gs_request_s>();
  handle->timeoutMs = c.config().timeoutMs;
  if (args.count > 0) {
    handle->request = c.submit(args, stream);
  } else {
    handle->request = std::make_shared<gs::control::Request>(args);
    handle->request->complete(Errc::kOk, "");
  }
  *out_request = handle.release();
}

// A C callback as a Request callback: the message is valid only during the call.
gs::control::Request::Callback completionCallback(gs_completion_fn fn, void* user) {
  return [fn, user](Errc code, const std::string& message) {
    fn(static_cast<gs_status_t>(code), message.c_str(), user);
  };
}

}  // namespace

extern "C" {

gs_status_t gs_config_init(gs_config_t* config) {
  return guard([&] {
    GS_ARG(config != nullptr, "config is NULL");
    memset(config, 0, sizeof(*config));
    config->struct_size = sizeof(*config);
    config->transport = nullptr;
    config->timeout_ms = -1;
    config->chunk_bytes = -1;
    config->codec = nullptr;
    config->metrics_address = nullptr;
    config->slots_per_peer = -1;
    config->sockets_per_peer = -1;
    config->codec_ladder = nullptr;
    config->codec_floor = nullptr;
    config->chunk_min_bytes = -1;
    config->chunk_max_bytes = -1;
    config->error_budget = -1;
    config->algo = nullptr;
    config->hostname = nullptr;
    config->shm = -1;
    config->staging_bytes = -1;
  });
}

const char* gs_status_string(gs_status_t status) {
  switch (status) {
    case GS_OK:
      return "GS_OK";
    case GS_IN_PROGRESS:
      return "GS_IN_PROGRESS";
    case GS_ERR_INVALID_ARGUMENT:
      return "GS_ERR_INVALID_ARGUMENT";
    case GS_ERR_UNSUPPORTED:
      return "GS_ERR_UNSUPPORTED";
    case GS_ERR_NO_MEMORY:
      return "GS_ERR_NO_MEMORY";
    case GS_ERR_SYSTEM:
      return "GS_ERR_SYSTEM";
    case GS_ERR_REMOTE:
      return "GS_ERR_REMOTE";
    case GS_ERR_TIMEOUT:
      return "GS_ERR_TIMEOUT";
    case GS_ERR_ABORTED:
      return "GS_ERR_ABORTED";
    case GS_ERR_INTERNAL:
      return "GS_ERR_INTERNAL";
  }
  return "unknown gs_status_t";
}

const char* gs_last_error(void) {
  return tLastError.c_str();
}

const char* gs_version_string(void) {
  return "0.1.0";
}

gs_status_t gs_get_unique_id(gs_unique_id_t* out_id) {
  return guard([&] {
    GS_ARG(out_id != nullptr, "out_id is NULL");
    const gs::Config cfg = makeConfig(nullptr);
    auto bytes = gs::control::createUniqueId(cfg).serialize();
    memcpy(out_id->internal, bytes.data(), bytes.size());
  });
}

gs_status_t gs_comm_init_rank_version(gs_comm_t* out_comm,
                                      int nranks,
                                      const gs_unique_id_t* id,
                                      int rank,
                                      const gs_config_t* config,
                                      int api_version) {
  return guard([&] {
    checkApiVersion(api_version);
    GS_ARG(out_comm != nullptr, "out_comm is NULL");
    GS_ARG(id != nullptr, "id is NULL");
    GS_ARG(nranks >= 1, "nranks %d must be >= 1", nranks);
    GS_ARG(rank >= 0 && rank < nranks, "rank %d is out of range [0, %d)", rank, nranks);
    const gs::Config cfg = makeConfig(config);
    gs::setLogRank(rank);
    auto uid = gs::control::UniqueId::parse(
        {reinterpret_cast<const uint8_t*>(id->internal), sizeof(id->internal)});
    auto handle = std::make_unique<gs_comm_s>();
    handle->comm = gs::control::Communicator::create(nranks, uid, rank, cfg);
    *out_comm = handle.release();
  });
}

gs_status_t gs_comm_init_from_env_version(gs_comm_t* out_comm,
                                          const gs_config_t* config,
                                          int api_version) {
  return guard([&] {
    checkApiVersion(api_version);
    GS_ARG(out_comm != nullptr, "out_comm is NULL");
    const gs::Config cfg = makeConfig(config);
    auto handle = std::make_unique<gs_comm_s>();
    handle->comm = gs::control::createFromEnvironment(cfg);
    gs::setLogRank(handle->comm->rank());
    *out_comm = handle.release();
  });
}

gs_status_t gs_comm_rank(gs_comm_t comm, int* out_rank) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(out_rank != nullptr, "out_rank is NULL");
    *out_rank = c.rank();
  });
}

gs_status_t gs_comm_size(gs_comm_t comm, int* out_size) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(out_size != nullptr, "out_size is NULL");
    *out_size = c.size();
  });
}

gs_status_t gs_comm_stats(gs_comm_t comm, gs_comm_stats_t* out_stats) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(out_stats != nullptr, "out_stats is NULL");
    GS_ARG(out_stats->struct_size >= offsetof(gs_comm_stats_t, errors),
           "out_stats->struct_size %zu is too small (set it to sizeof(gs_comm_stats_t))",
           out_stats->struct_size);
    const auto st = c.stats();
    const auto& snap = st.snapshot;
    gs_comm_stats_t v;
    memset(&v, 0, sizeof(v));
    v.struct_size = std::min(out_stats->struct_size, sizeof(v));
    v.collectives = snap.collectives;
    v.errors = snap.errorsTotal;
    v.bytes_logical = snap.bytesLogical;
    v.bytes_wire = snap.bytesWire;
    v.chunks_sent = snap.chunksSent;
    v.chunks_received = snap.chunksReceived;
    v.compression_ratio = snap.compressionRatio();
    v.credit_wait_seconds = static_cast<double>(snap.creditWaitNs) * 1e-9;
    // Latency quantiles over all links: the slowest link's bucket bound.
    for (const auto& l : snap.links) {
      v.chunk_latency_p50_seconds =
          std::max(v.chunk_latency_p50_seconds, l.latencyQuantileSeconds(0.5));
      v.chunk_latency_p99_seconds =
          std::max(v.chunk_latency_p99_seconds, l.latencyQuantileSeconds(0.99));
    }
    v.last_seconds = st.lastSeconds;
    v.last_algbw = st.lastAlgbw;
    v.last_busbw = st.lastBusbw;
    snprintf(v.metrics_address, sizeof(v.metrics_address), "%s", st.metricsAddress.c_str());
    snprintf(v.last_algorithm, sizeof(v.last_algorithm), "%s", st.lastAlgorithm.c_str());
    snprintf(v.transport, sizeof(v.transport), "%s", c.transportName().c_str());
    snprintf(v.device_path, sizeof(v.device_path), "%s",
             st.snapshot.stagedCollectives > 0 ? "pinned_host_staging" : "");
    v.staged_collectives = st.snapshot.stagedCollectives;
    v.staged_to_host_bytes = st.snapshot.stagedToHostBytes;
    v.staged_to_device_bytes = st.snapshot.stagedToDeviceBytes;
    // Versioned copy: only what the caller's struct has room for.
    memcpy(out_stats, &v, v.struct_size);
  });
}

gs_status_t gs_comm_abort(gs_comm_t comm) {
  return guard([&] { communicator(comm).abort(); });
}

gs_status_t gs_comm_destroy(gs_comm_t comm) {
  return guard([&] { delete comm; });
}

gs_status_t gs_allreduce(const void* sendbuff,
                         void* recvbuff,
                         size_t count,
                         gs_dtype_t dtype,
                         gs_redop_t op,
                         gs_comm_t comm,
                         struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, allreduceArgs(sendbuff, recvbuff, count, dtype, op, comm), cuda_stream);
  });
}

gs_status_t gs_reduce_scatter(const void* sendbuff,
                              void* recvbuff,
                              size_t recvcount,
                              gs_dtype_t dtype,
                              gs_redop_t op,
                              gs_comm_t comm,
                              struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, reduceScatterArgs(sendbuff, recvbuff, recvcount, dtype, op, comm),
                cuda_stream);
  });
}

gs_status_t gs_allgather(const void* sendbuff,
                         void* recvbuff,
                         size_t sendcount,
                         gs_dtype_t dtype,
                         gs_comm_t comm,
                         struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, allgatherArgs(sendbuff, recvbuff, sendcount, dtype, comm), cuda_stream);
  });
}

gs_status_t gs_broadcast(const void* sendbuff,
                         void* recvbuff,
                         size_t count,
                         gs_dtype_t dtype,
                         int root,
                         gs_comm_t comm,
                         struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, broadcastArgs(sendbuff, recvbuff, count, dtype, root, comm), cuda_stream);
  });
}

gs_status_t gs_iallreduce(const void* sendbuff,
                          void* recvbuff,
                          size_t count,
                          gs_dtype_t dtype,
                          gs_redop_t op,
                          gs_comm_t comm,
                          struct CUstream_st* cuda_stream,
                          gs_request_t* out_request) {
  return guard([&] {
    issue(comm, allreduceArgs(sendbuff, recvbuff, count, dtype, op, comm), cuda_stream,
          out_request);
  });
}

gs_status_t gs_ireduce_scatter(const void* sendbuff,
                               void* recvbuff,
                               size_t recvcount,
                               gs_dtype_t dtype,
                               gs_redop_t op,
                               gs_comm_t comm,
                               struct CUstream_st* cuda_stream,
                               gs_request_t* out_request) {
  return guard([&] {
    issue(comm, reduceScatterArgs(sendbuff, recvbuff, recvcount, dtype, op, comm), cuda_stream,
          out_request);
  });
}

gs_status_t gs_iallgather(const void* sendbuff,
                          void* recvbuff,
                          size_t sendcount,
                          gs_dtype_t dtype,
                          gs_comm_t comm,
                          struct CUstream_st* cuda_stream,
                          gs_request_t* out_request) {
  return guard([&] {
    issue(comm, allgatherArgs(sendbuff, recvbuff, sendcount, dtype, comm), cuda_stream,
          out_request);
  });
}

gs_status_t gs_ibroadcast(const void* sendbuff,
                          void* recvbuff,
                          size_t count,
                          gs_dtype_t dtype,
                          int root,
                          gs_comm_t comm,
                          struct CUstream_st* cuda_stream,
                          gs_request_t* out_request) {
  return guard([&] {
    issue(comm, broadcastArgs(sendbuff, recvbuff, count, dtype, root, comm), cuda_stream,
          out_request);
  });
}

gs_status_t gs_request_on_complete(gs_request_t request, gs_completion_fn fn, void* user_data) {
  return guard([&] {
    GS_ARG(request != nullptr && request->request != nullptr, "request is NULL");
    GS_ARG(fn != nullptr, "fn is NULL");
    // fn may free the handle (and with it this reference) while it runs: hold one of our own.
    const std::shared_ptr<gs::control::Request> keep = request->request;
    keep->onComplete(completionCallback(fn, user_data));
  });
}

static gs_status_t requestStatus(const gs_request_t request) {
  const Errc code = request->request->status();
  if (code != Errc::kOk)
    setLastError(request->request->message().c_str());
  return static_cast<gs_status_t>(code);
}

gs_status_t gs_test(gs_request_t request, int* out_done) {
  return guardStatus([&] {
    GS_ARG(request != nullptr, "request is NULL");
    GS_ARG(out_done != nullptr, "out_done is NULL");
    if (!request->request->done()) {
      *out_done = 0;
      return GS_IN_PROGRESS;
    }
    *out_done = 1;
    return requestStatus(request);
  });
}

gs_status_t gs_wait(gs_request_t request, int timeout_ms) {
  return guardStatus([&] {
    GS_ARG(request != nullptr, "request is NULL");
    const int64_t ms = timeout_ms >= 0 ? timeout_ms : request->timeoutMs;
    if (!request->request->waitUntil(gs::Deadline::afterMs(ms))) {
      setLastError(
          gs::formatString("request still running after %lld ms", static_cast<long long>(ms))
              .c_str());
      return GS_ERR_TIMEOUT;
    }
    return requestStatus(request);
  });
}

gs_status_t gs_request_free(gs_request_t request) {
  return guardStatus([&] {
    if (request == nullptr)
      return GS_OK;
    // The progress thread may still write into the user's buffers: wait (bounded) first.
    if (!request->request->waitUntil(gs::Deadline::afterMs(request->timeoutMs))) {
      setLastError("request still running; not freed");
      return GS_ERR_TIMEOUT;
    }
    delete request;
    return GS_OK;
  });
}

gs_status_t gs_stream_config_init(gs_stream_config_t* config) {
  return guard([&] {
    GS_ARG(config != nullptr, "config is NULL");
    memset(config, 0, sizeof(*config));
    config->struct_size = sizeof(*config);
    config->bucket_bytes = -1;
    config->error_feedback = 0;
    config->codec = nullptr;
    config->cuda_stream = nullptr;
  });
}

gs_status_t gs_stream_open(gs_comm_t comm,
                           void* buffer,
                           size_t count,
                           gs_dtype_t dtype,
                           gs_redop_t op,
                           const gs_stream_config_t* config,
                           gs_stream_t* out_stream) {
  return guard([&] {
    checkTypes(dtype, op);
    auto& c = communicator(comm);
    GS_ARG(out_stream != nullptr, "out_stream is NULL");
    GS_ARG(count == 0 || buffer != nullptr, "buffer is NULL");
    bytesOf(count, dtype, 1, "count");
    gs::control::GradientStreamConfig cfg;
    if (config != nullptr) {
      GS_ARG(config->struct_size >= offsetof(gs_stream_config_t, codec) + sizeof(config->codec),
             "config->struct_size %zu is too small (call gs_stream_config_init)",
             config->struct_size);
      if (config->bucket_bytes >= 0)
        cfg.bucketBytes = static_cast<size_t>(config->bucket_bytes);
      cfg.errorFeedback = config->error_feedback != 0;
      if (config->codec != nullptr)
        cfg.codec = config->codec;
      if (config->struct_size >= offsetof(gs_stream_config_t, cuda_stream) + sizeof(void*))
        cfg.cudaStream = config->cuda_stream;
    }
    auto handle = std::make_unique<gs_stream_s>();
    handle->timeoutMs = c.config().timeoutMs;
    handle->stream = std::make_unique<gs::control::GradientStream>(
        c, buffer, count, static_cast<gs::DataType>(dtype), static_cast<gs::ReduceOp>(op), cfg);
    *out_stream = handle.release();
  });
}

static gs::control::GradientStream& gradientStream(gs_stream_t s) {
  GS_ARG(s != nullptr && s->stream != nullptr, "stream is NULL");
  return *s->stream;
}

gs_status_t gs_stream_begin(gs_stream_t stream) {
  return guard([&] { gradientStream(stream).begin(); });
}

gs_status_t gs_stream_ready(gs_stream_t stream, size_t offset, size_t count) {
  return guard([&] { gradientStream(stream).ready(offset, count); });
}

gs_status_t gs_stream_wait(gs_stream_t stream, int timeout_ms) {
  return guard([&] {
    auto& s = gradientStream(stream);
    s.wait(timeout_ms >= 0 ? timeout_ms : stream->timeoutMs);
  });
}

gs_status_t gs_stream_on_complete(gs_stream_t stream, gs_completion_fn fn, void* user_data) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(fn != nullptr, "fn is NULL");
    s.onComplete(completionCallback(fn, user_data));
  });
}

gs_status_t gs_stream_close(gs_stream_t stream) {
  return guard([&] { delete stream; });
}

gs_status_t gs_stream_residual_bytes(gs_stream_t stream, size_t* out_bytes) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(out_bytes != nullptr, "out_bytes is NULL");
    *out_bytes = s.residualBytes();
  });
}

gs_status_t gs_stream_save_residual(gs_stream_t stream, void* out, size_t bytes) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(out != nullptr || bytes == 0, "out is NULL");
    s.saveResidual(out, bytes);
  });
}

gs_status_t gs_stream_load_residual(gs_stream_t stream, const void* in, size_t bytes) {
  return guard([&] {
    auto& s = gradientStream(stream);
    GS_ARG(in != nullptr || bytes == 0, "in is NULL");
    s.loadResidual(in, bytes);
  });
}

}  // extern "C"
