/*
 * gradstream: gradient streaming and reduction between GPUs and hosts.
 *
 * The only exported surface of libgradstream. C99, opaque handles, NCCL-like semantics:
 * one communicator per process group; collectives are called by every rank of the
 * communicator in the same order with matching arguments.
 *
 * Thread safety: distinct communicators may be used from distinct threads concurrently. Calls
 * on one communicator are serialized by the library (a second caller waits for the first);
 * gs_comm_abort() may be called from any thread at any time.
 *
 * Errors: every function returns gs_status_t. On failure, gs_last_error() returns a message
 * for the calling thread naming the argument or peer at fault. Output parameters are written
 * only on success.
 */
#ifndef GRADSTREAM_GRADSTREAM_H_
#define GRADSTREAM_GRADSTREAM_H_

#include <stddef.h>
#include <stdint.h>

#include "gradstream/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** ABI version of this header; gs_*_create functions reject another major version. */
#define GS_VERSION_MAJOR 0
#define GS_VERSION_MINOR 1
#define GS_VERSION_PATCH 0
#define GS_API_VERSION (GS_VERSION_MAJOR * 10000 + GS_VERSION_MINOR * 100 + GS_VERSION_PATCH)

/** Status codes. GS_OK is zero, errors are negative. */
typedef enum {
  GS_OK = 0,
  GS_IN_PROGRESS = 1,           /**< a non-blocking operation has not finished yet */
  GS_ERR_INVALID_ARGUMENT = -1, /**< an argument (named in gs_last_error) is invalid */
  GS_ERR_UNSUPPORTED = -2,      /**< not available in this build or on this machine */
  GS_ERR_NO_MEMORY = -3,
  GS_ERR_SYSTEM = -4,  /**< an operating system or device call failed */
  GS_ERR_REMOTE = -5,  /**< a peer failed, disconnected or sent invalid data */
  GS_ERR_TIMEOUT = -6, /**< a deadline passed */
  GS_ERR_ABORTED = -7, /**< gs_comm_abort() was called */
  GS_ERR_INTERNAL = -8
} gs_status_t;

typedef enum {
  GS_FLOAT32 = 0,
  GS_FLOAT16 = 1,
  GS_BFLOAT16 = 2,
  GS_FLOAT64 = 3,
  GS_INT32 = 4,
  GS_INT64 = 5,
  GS_UINT8 = 6
} gs_dtype_t;

typedef enum { GS_SUM = 0, GS_AVG = 1, GS_MIN = 2, GS_MAX = 3, GS_PROD = 4 } gs_redop_t;

/** A CUDA stream (ABI-identical to cudaStream_t); declared here so C callers need no CUDA header.
 */
struct CUstream_st;

typedef struct gs_comm_s* gs_comm_t;
typedef struct gs_request_s* gs_request_t;

/**
 * Opaque bootstrap token made by rank 0 with gs_get_unique_id() and shared with the other
 * ranks by the launcher (like ncclUniqueId). Carries rank 0's rendezvous address and a random
 * communicator secret: only ranks holding it can join. Treat it as a credential.
 */
#define GS_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[GS_UNIQUE_ID_BYTES];
} gs_unique_id_t;

/**
 * Communicator configuration. Versioned: struct_size is the first field and new fields are
 * only ever added at the end. Fill with gs_config_init() before setting fields. Fields left
 * unset (NULL strings, negative numbers) take the library default. Environment variables
 * (GS_TRANSPORT, GS_TIMEOUT_MS, GS_CHUNK_BYTES, ...) override these fields.
 */
typedef struct {
  size_t struct_size;
  const char* transport;       /**< "auto" (default), "tcp", "loopback" (threads as ranks) */
  int64_t timeout_ms;          /**< deadline for every wait; default 60000 */
  int64_t chunk_bytes;         /**< pipeline chunk size; default 1 MiB */
  const char* codec;           /**< wire codec: "raw" (default), "bf16", "int8", ... or "auto" */
  const char* metrics_address; /**< Prometheus exporter "host:port" (+ local rank); NULL: off */
  int64_t slots_per_peer;      /**< receive slots (chunks in flight) per peer; default 8 */
  int64_t sockets_per_peer;    /**< tcp sockets per peer; default 2 */
  /* codec = "auto": an adaptive controller picks each link's codec from a ladder. */
  const char* codec_ladder; /**< rungs, most precise first; default "raw,bf16,fp8e4m3,int8,int4" */
  const char* codec_floor;  /**< least precise rung allowed; default "int4" */
  int64_t chunk_min_bytes;  /**< chunk size bounds of the controller; default 256 KiB */
  int64_t chunk_max_bytes;  /**< default 2 MiB */
  double error_budget;      /**< relative L2 error allowed on sampled lossy chunks; default 0.05 */
  const char* algo;         /**< allreduce algorithm: "auto" (default, cost model), "ring",
                                 "tree", "halving_doubling", "hierarchical",
                                 "recursive_doubling" */
  const char* hostname;     /**< groups ranks into hosts; default gethostname() */
  int64_t shm;              /**< 1 (default): shared memory between ranks of one host; 0 off */
  int64_t staging_bytes;    /**< CUDA device buffers: size of each of the two pinned host
                                 staging slots; default 32 MiB */
} gs_config_t;

/** Fills *config with "unset" for every field. Returns GS_ERR_INVALID_ARGUMENT for NULL. */
GS_API gs_status_t gs_config_init(gs_config_t* config);

/** Human-readable name of a status code; never NULL. */
GS_API const char* gs_status_string(gs_status_t status);

/** Message describing the calling thread's last failure; "" if none. Never NULL. */
GS_API const char* gs_last_error(void);

/** Library version as "major.minor.patch". */
GS_API const char* gs_version_string(void);

/**
 * Creates a unique id on rank 0 and starts its rendezvous listener (on the interface named by
 * GS_SOCKET_IFNAME, loopback when unset). The listener lives until every rank has registered,
 * or until the timeout (GS_TIMEOUT_MS) passes: from this call while no rank has registered,
 * from the first registration on after that. Connections that do not authenticate within a
 * quarter of the timeout (at most 5 s) are closed.
 */
GS_API gs_status_t gs_get_unique_id(gs_unique_id_t* out_id);

/**
 * Creates a communicator of nranks ranks; blocks until all ranks have joined (collective).
 * config may be NULL for defaults.
 */
GS_API gs_status_t gs_comm_init_rank_version(gs_comm_t* out_comm,
                                             int nranks,
                                             const gs_unique_id_t* id,
                                             int rank,
                                             const gs_config_t* config,
                                             int api_version);
static inline gs_status_t gs_comm_init_rank(gs_comm_t* out_comm,
                                            int nranks,
                                            const gs_unique_id_t* id,
                                            int rank,
                                            const gs_config_t* config) {
  return gs_comm_init_rank_version(out_comm, nranks, id, rank, config, GS_API_VERSION);
}

/**
 * Creates a communicator from the launcher's environment: RANK/WORLD_SIZE/MASTER_ADDR/
 * MASTER_PORT (torchrun), SLURM_PROCID/SLURM_NTASKS (Slurm; MASTER_ADDR/PORT still needed),
 * or OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (mpirun). Rank 0 listens on MASTER_ADDR:
 * MASTER_PORT. The communicator secret comes from GS_SECRET (recommended) and is otherwise
 * derived from the rendezvous address, which a warning says.
 */
GS_API gs_status_t gs_comm_init_from_env_version(gs_comm_t* out_comm,
                                                 const gs_config_t* config,
                                                 int api_version);
static inline gs_status_t gs_comm_init_from_env(gs_comm_t* out_comm, const gs_config_t* config) {
  return gs_comm_init_from_env_version(out_comm, config, GS_API_VERSION);
}

GS_API gs_status_t gs_comm_rank(gs_comm_t comm, int* out_rank);
GS_API gs_status_t gs_comm_size(gs_comm_t comm, int* out_size);

/**
 * Aborts the communicator: a collective blocked in another thread returns GS_ERR_ABORTED,
 * peers are told, and every later call on comm fails with GS_ERR_ABORTED. Returns promptly.
 * The communicator must still be destroyed with gs_comm_destroy().
 */
GS_API gs_status_t gs_comm_abort(gs_comm_t comm);

/** gs_comm_split's color for a rank that joins no new communicator. */
#define GS_SPLIT_NOCOLOR (-1)

/**
 * Collective over comm: the ranks passing one color (>= 0) form a new communicator, ranked by
 * key, then by their rank in comm; GS_SPLIT_NOCOLOR gives *out_comm = NULL. No unique id and
 * no rendezvous: comm carries the members' records (three allgathers over comm). config NULL:
 * the parent's settings. The child has links of its own (not comm's), each made when a call of
 * the child first needs it, and is independent of comm afterwards (destroy either first).
 * A color below -1 on any rank, or a member whose settings are refused or whose devices cannot
 * open, fails the call naming that rank (every rank for a bad color, its group otherwise); comm
 * stays usable.
 */
GS_API gs_status_t
gs_comm_split(gs_comm_t comm, int color, int key, const gs_config_t* config, gs_comm_t* out_comm);

/**
 * Registers [buff, buff + size) for reuse across calls (NCCL's ncclCommRegister). Collectives
 * whose send and receive buffers lie inside registered ranges keep their transport
 * registrations and plans from one call to the next; without it, a transport that pins pages
 * (verbs) registers the caller's buffers at every call and drops them afterwards, since it
 * cannot know the memory still belongs to the caller (freed and reused memory at one address
 * is other pages). The caller keeps the memory allocated until gs_comm_deregister(comm,
 * *out_handle). Calls on unregistered buffers stay correct as before. Not collective; waits
 * for a running collective. Registering the same address twice is GS_ERR_INVALID_ARGUMENT.
 * gs_comm_stats_t.buffer_registrations counts the registrations made.
 */
GS_API gs_status_t gs_comm_register(gs_comm_t comm, void* buff, size_t size, void** out_handle);
/** Drops a registration (and its transport registrations); a handle not from
 * gs_comm_register on comm, or already deregistered, is GS_ERR_INVALID_ARGUMENT. */
GS_API gs_status_t gs_comm_deregister(gs_comm_t comm, void* handle);

/** Frees the communicator. gs_comm_destroy(NULL) is a no-op. Not collective. */
GS_API gs_status_t gs_comm_destroy(gs_comm_t comm);

/**
 * Figures of this rank's communicator since it was created (the same data the Prometheus
 * exporter serves, without HTTP). Versioned: set struct_size = sizeof(gs_comm_stats_t) before
 * the call; fields past the caller's struct_size are not written. Thread-safe, may be called
 * while a collective runs.
 */
typedef struct {
  size_t struct_size;
  uint64_t collectives;   /**< collectives completed on this rank */
  uint64_t errors;        /**< collectives that failed */
  uint64_t bytes_logical; /**< element bytes this rank sent, before encoding */
  uint64_t bytes_wire;    /**< bytes this rank put on the wire (headers, metadata, payload) */
  uint64_t chunks_sent;
  uint64_t chunks_received;
  double compression_ratio;         /**< bytes_logical / bytes_wire */
  double credit_wait_seconds;       /**< time ready chunks waited for a peer's receive slot */
  double chunk_latency_p50_seconds; /**< post-to-completion, upper bound of the histogram bucket */
  double chunk_latency_p99_seconds;
  double last_seconds; /**< duration of the last collective */
  double last_algbw;   /**< its algbw and busbw in bytes/s (nccl-tests conventions) */
  double last_busbw;
  char metrics_address[64];    /**< "host:port" of the Prometheus exporter, "" when off */
  char last_algorithm[32];     /**< schedule of the last collective: "ring", "tree", ...;
                                    "small_exchange": a 2-rank call through shm mailboxes */
  char transport[32];          /**< what carries this rank's links: "tcp", "verbs", "loopback",
                                    "shm" (all same-host peers), "shm+tcp" / "shm+verbs" (both) */
  char device_path[32];        /**< how CUDA device buffers travel: "pinned_host_staging" once a
                                    collective or message on device buffers ran, "" before */
  uint64_t staged_collectives; /**< collectives and point-to-point messages on device
                                    buffers, and the bytes they copied */
  uint64_t staged_to_host_bytes;
  uint64_t staged_to_device_bytes;
  uint64_t buffer_registrations;    /**< registrations of callers' buffers with a transport
                                         device (verbs pins pages at each: gs_comm_register) */
  uint64_t buffer_registered_bytes; /**< and their bytes */
  uint64_t single_copy_bytes;       /**< bytes received by copying them straight out of a
                                         same-host peer's memory (GS_SHM_SINGLE_COPY) */
} gs_comm_stats_t;

GS_API gs_status_t gs_comm_stats(gs_comm_t comm, gs_comm_stats_t* out_stats);

/**
 * Collectives. Buffers are host memory (pageable, pinned or managed) or CUDA device memory.
 * Host buffers: the call blocks until the result is in recvbuff on this rank; with a non-NULL
 * cuda_stream it first waits for the work enqueued on that stream.
 * Device buffers (one device per call): they are staged through pinned host memory in pieces
 * (GS_STAGING_BYTES), copies ordered on cuda_stream (NULL: the legacy default stream). The
 * call returns once the reduction is done on the host and the copies of the result into
 * recvbuff are enqueued on the stream: later work on that stream sees the result; the host
 * must synchronize the stream before reading recvbuff itself. Unlike NCCL the calling thread
 * takes part (it waits for the input copies, bounded by the timeout). A build or host without
 * CUDA rejects a non-NULL cuda_stream with GS_ERR_UNSUPPORTED naming the reason.
 * send == recv (in place) is allowed; for reduce-scatter
 * in place means recv == send + rank * recvcount, for allgather send == recv + rank *
 * sendcount (NCCL conventions). A count of 0 is a no-op that still checks its arguments.
 */
GS_API gs_status_t gs_allreduce(const void* sendbuff,
                                void* recvbuff,
                                size_t count,
                                gs_dtype_t dtype,
                                gs_redop_t op,
                                gs_comm_t comm,
                                struct CUstream_st* cuda_stream);
GS_API gs_status_t gs_reduce_scatter(const void* sendbuff,
                                     void* recvbuff,
                                     size_t recvcount,
                                     gs_dtype_t dtype,
                                     gs_redop_t op,
                                     gs_comm_t comm,
                                     struct CUstream_st* cuda_stream);
GS_API gs_status_t gs_allgather(const void* sendbuff,
                                void* recvbuff,
                                size_t sendcount,
                                gs_dtype_t dtype,
                                gs_comm_t comm,
                                struct CUstream_st* cuda_stream);
/** sendbuff is read on root only (may be NULL elsewhere); recvbuff is written on every rank. */
GS_API gs_status_t gs_broadcast(const void* sendbuff,
                                void* recvbuff,
                                size_t count,
                                gs_dtype_t dtype,
                                int root,
                                gs_comm_t comm,
                                struct CUstream_st* cuda_stream);

/**
 * Reduce to root (NCCL's ncclReduce): recvbuff is written on root only (may be NULL elsewhere;
 * sendbuff == recvbuff on root is in place). For latency-bound sizes every rank sends straight
 * to root (linear) or along a binomial tree, a pipelined chain toward root for the rest, chosen
 * by the cost model (logged at info when the choice changes; GS_REDUCE_ALGO fixes it). Every
 * rank must pass the same root and op.
 */
GS_API gs_status_t gs_reduce(const void* sendbuff,
                             void* recvbuff,
                             size_t count,
                             gs_dtype_t dtype,
                             gs_redop_t op,
                             int root,
                             gs_comm_t comm,
                             struct CUstream_st* stream);
/**
 * All-to-all: count elements per peer. Block j of sendbuff (count * size elements) goes to
 * rank j, block i of recvbuff comes from rank i. Every peer's exchange is in flight at once. A
 * floating-point dtype travels with the communicator's codec (exact for raw); sendbuff ==
 * recvbuff is in place; other overlap is an error. Links to peers no other collective uses are
 * made at the first call (collective, within the timeout).
 */
GS_API gs_status_t gs_alltoall(const void* sendbuff,
                               void* recvbuff,
                               size_t count,
                               gs_dtype_t dtype,
                               gs_comm_t comm,
                               struct CUstream_st* stream);
/**
 * All-to-all with per-peer counts and displacements, in elements, one entry per rank (MPI's
 * MPI_Alltoallv): sendcounts[j] elements at sendbuff + sdispls[j] go to rank j, recvcounts[i]
 * from rank i land at recvbuff + rdispls[i]; what lies between the blocks is not written.
 * sendcounts[j] on rank i must equal recvcounts[i] on rank j: a pair that disagrees fails on
 * the receiving rank with both counts in the message (and on every rank still running the
 * call). Blocks of a buffer must not overlap each other, nor sendbuff recvbuff. Host buffers
 * only for now (device buffers: GS_ERR_UNSUPPORTED).
 */
GS_API gs_status_t gs_alltoallv(const void* sendbuff,
                                const size_t* sendcounts,
                                const size_t* sdispls,
                                void* recvbuff,
                                const size_t* recvcounts,
                                const size_t* rdispls,
                                gs_dtype_t dtype,
                                gs_comm_t comm,
                                struct CUstream_st* stream);
/**
 * Point-to-point (NCCL's ncclSend / ncclRecv, MPI's send and receive): count elements of dtype
 * from buff on this rank to buff on rank peer. Messages between a pair match in posting order,
 * one send with one receive; there are no tags and no wildcard sources. A send and its receive
 * must agree on count and dtype: a pair that disagrees fails on both ranks, the message naming
 * both counts, and nothing of that message is written. Float messages honour the
 * communicator's codec like the collectives (decoded on arrival; exact for raw and integers).
 *
 * A send completes once its bytes have left buff and the receiver has the whole message (its
 * receive consumed every chunk) or, for a message of at most 32 KiB, has posted the receive
 * that takes it with the same count and dtype; a receive once the message is in buff: then the
 * buffer may be reused. gs_send and gs_recv
 * block until then, so two ranks that both call gs_send to each other first wait for each
 * other until the timeout; exchange with gs_isend / gs_irecv (any order, any size) and wait
 * for both. Point-to-point requests posted back to back run concurrently, newly posted ones
 * joining those in flight; a collective issued after them starts once they completed (issue
 * order). Requests complete in issue order. The first message between two ranks that share
 * no link (the ring's and the algorithms' neighbours do) sets one up; both ranks reach it at
 * their first message to each other.
 *
 * peer must be another rank of comm (not this one).
 *
 * CUDA: buff may be device memory; then the message travels through a pinned host buffer of
 * the communicator's pool (reused across messages, at most 2 x GS_STAGING_BYTES kept between
 * messages, freed by gs_comm_destroy). A send's bytes are copied device -> pinned on the
 * communicator's own stream after the work enqueued on `stream` (NULL: the legacy default
 * stream) before the call (gs_send) or before the request was issued (gs_isend): what that
 * work wrote is what is sent. A receive's bytes are copied pinned -> device once the whole
 * message arrived (also after that earlier work), and gs_recv returns, or gs_irecv's request
 * completes (gs_test / gs_wait / callback), only once they are in device memory: any stream
 * and the host may then read buff. A failed receive (a count mismatch, a peer's failure)
 * writes nothing to buff. Host buffers with a non-NULL stream first wait for the work
 * enqueued on it, as the collectives do. Waits for the device are bounded by the timeout.
 */
GS_API gs_status_t gs_send(const void* buff,
                           size_t count,
                           gs_dtype_t dtype,
                           int peer,
                           gs_comm_t comm,
                           struct CUstream_st* stream);
GS_API gs_status_t gs_recv(void* buff,
                           size_t count,
                           gs_dtype_t dtype,
                           int peer,
                           gs_comm_t comm,
                           struct CUstream_st* stream);
GS_API gs_status_t gs_isend(const void* buff,
                            size_t count,
                            gs_dtype_t dtype,
                            int peer,
                            gs_comm_t comm,
                            struct CUstream_st* stream,
                            gs_request_t* out_request);
GS_API gs_status_t gs_irecv(void* buff,
                            size_t count,
                            gs_dtype_t dtype,
                            int peer,
                            gs_comm_t comm,
                            struct CUstream_st* stream,
                            gs_request_t* out_request);

/**
 * Returns once every rank of comm has called it (and every earlier request of this rank is
 * done: it runs in issue order like any call). Not in NCCL; what torch.distributed.barrier and
 * MPI_Barrier users expect.
 */
GS_API gs_status_t gs_barrier(gs_comm_t comm);

/**
 * Non-blocking collectives: the blocking calls' arguments and checks, plus *out_request.
 * Requests on one communicator (of every kind, and gradient-stream buckets) complete in the
 * order they were issued; a progress thread of the communicator runs them, so the caller may
 * compute in the meantime. The buffers must stay valid until the request is complete. A blocking
 * call issued after requests runs after them.
 * CUDA: buffers may be device memory. The collective reads what the work enqueued on
 * cuda_stream (NULL: the legacy default stream) before this call wrote (an event is recorded on
 * it now; later work on the stream does not delay the request). Its copies run on the
 * communicator's own stream through pinned host staging, and the request completes (gs_test /
 * gs_wait / callback) once the results are in recvbuff: any stream may then read them. Host
 * buffers with a non-NULL cuda_stream likewise wait for the stream's earlier work.
 */
GS_API gs_status_t gs_iallreduce(const void* sendbuff,
                                 void* recvbuff,
                                 size_t count,
                                 gs_dtype_t dtype,
                                 gs_redop_t op,
                                 gs_comm_t comm,
                                 struct CUstream_st* cuda_stream,
                                 gs_request_t* out_request);
GS_API gs_status_t gs_ireduce_scatter(const void* sendbuff,
                                      void* recvbuff,
                                      size_t recvcount,
                                      gs_dtype_t dtype,
                                      gs_redop_t op,
                                      gs_comm_t comm,
                                      struct CUstream_st* cuda_stream,
                                      gs_request_t* out_request);
GS_API gs_status_t gs_iallgather(const void* sendbuff,
                                 void* recvbuff,
                                 size_t sendcount,
                                 gs_dtype_t dtype,
                                 gs_comm_t comm,
                                 struct CUstream_st* cuda_stream,
                                 gs_request_t* out_request);
GS_API gs_status_t gs_ibroadcast(const void* sendbuff,
                                 void* recvbuff,
                                 size_t count,
                                 gs_dtype_t dtype,
                                 int root,
                                 gs_comm_t comm,
                                 struct CUstream_st* cuda_stream,
                                 gs_request_t* out_request);

GS_API gs_status_t gs_ireduce(const void* sendbuff,
                              void* recvbuff,
                              size_t count,
                              gs_dtype_t dtype,
                              gs_redop_t op,
                              int root,
                              gs_comm_t comm,
                              struct CUstream_st* stream,
                              gs_request_t* out_request);
GS_API gs_status_t gs_ialltoall(const void* sendbuff,
                                void* recvbuff,
                                size_t count,
                                gs_dtype_t dtype,
                                gs_comm_t comm,
                                struct CUstream_st* stream,
                                gs_request_t* out_request);
/** The arrays are copied before this returns; the buffers must stay valid until completion. */
GS_API gs_status_t gs_ialltoallv(const void* sendbuff,
                                 const size_t* sendcounts,
                                 const size_t* sdispls,
                                 void* recvbuff,
                                 const size_t* recvcounts,
                                 const size_t* rdispls,
                                 gs_dtype_t dtype,
                                 gs_comm_t comm,
                                 struct CUstream_st* stream,
                                 gs_request_t* out_request);

/**
 * Completion callback: status is the operation's (GS_OK or the error), message what
 * gs_last_error() would say for it ("" on success; valid only during the call).
 */
typedef void (*gs_completion_fn)(gs_status_t status, const char* message, void* user_data);

/**
 * Calls fn(status, message, user_data) once when the request completes: on the thread that ran
 * it, right after the results are in place (the communicator's progress thread, or a thread
 * waiting for it in gs_wait / gs_request_free, which runs queued requests itself when nobody
 * else does), or at once on the calling thread when it already has. A waiter may return before
 * the callbacks of its request have run. Several callbacks may be registered; they run in
 * registration order. fn must return promptly and must not wait for a later request of the same
 * communicator (the progress thread is running fn); it may call gs_request_free on this request.
 * The request handle must still be freed with gs_request_free (which returns at once for a finished
 * request).
 */
GS_API gs_status_t gs_request_on_complete(gs_request_t request,
                                          gs_completion_fn fn,
                                          void* user_data);
/** *out_done = 1 when finished; returns the operation's status once finished. */
GS_API gs_status_t gs_test(gs_request_t request, int* out_done);
/**
 * Waits up to timeout_ms (negative: the communicator's timeout); GS_ERR_TIMEOUT if still busy.
 * A wait as long as the communicator's timeout (or negative) runs the request on this thread
 * when it is still queued and no other thread is running the queue (earlier requests first,
 * issue order kept): isend + irecv + wait then costs no thread hand-off.
 */
GS_API gs_status_t gs_wait(gs_request_t request, int timeout_ms);
/** Frees a finished request. A request still running is waited for first. NULL is a no-op. */
GS_API gs_status_t gs_request_free(gs_request_t request);

/* ---- Gradient streams ---------------------------------------------------------------------
 * A gradient buffer reduced in place (allreduce with op) bucket by bucket while the backward
 * pass still produces it. Mark ranges final with gs_stream_ready(); every bucket whose elements
 * are all final is reduced at once on the communicator's progress thread, so communication
 * overlaps compute. Buckets are reduced in one fixed order (last first), so ranks may mark
 * ranges in different orders. One thread drives a stream: begin, ready..., wait.
 */
typedef struct gs_stream_s* gs_stream_t;

typedef struct {
  size_t struct_size;
  int64_t bucket_bytes; /**< reduction granularity; < 0: default 4 MiB */
  int error_feedback;   /**< 1: keep what a lossy codec dropped per element, add it next time */
  const char* codec;    /**< NULL: the communicator's codec (gs_config_t.codec / GS_CODEC) */
  /** CUDA: the stream whose work produces the buffer (NULL: the legacy default stream). Each
   * bucket reads what was enqueued there before the gs_stream_ready call that completed it; the
   * buffer may be device memory (pinned host staging, as gs_iallreduce; the error-feedback
   * residual stays in host memory). A host buffer with a non-NULL stream likewise waits for its
   * work. With error feedback the residual is added once that work is done. */
  struct CUstream_st* cuda_stream;
} gs_stream_config_t;

GS_API gs_status_t gs_stream_config_init(gs_stream_config_t* config);
/** Opens a stream over buffer (count elements); config may be NULL. The buffer must stay valid
 * until gs_stream_close. The communicator must outlive the stream. */
GS_API gs_status_t gs_stream_open(gs_comm_t comm,
                                  void* buffer,
                                  size_t count,
                                  gs_dtype_t dtype,
                                  gs_redop_t op,
                                  const gs_stream_config_t* config,
                                  gs_stream_t* out_stream);
/** Starts an iteration (the previous one must have been waited for). */
GS_API gs_status_t gs_stream_begin(gs_stream_t stream);
/** Elements [offset, offset + count) are final for this iteration. Each element once. */
GS_API gs_status_t gs_stream_ready(gs_stream_t stream, size_t offset, size_t count);
/** Waits until every bucket is reduced on this rank (timeout_ms < 0: the communicator's
 * timeout). GS_ERR_INVALID_ARGUMENT if some range was never marked ready. */
GS_API gs_status_t gs_stream_wait(gs_stream_t stream, int timeout_ms);
/** Ends the iteration without blocking (instead of gs_stream_wait): fn(status, message,
 * user_data) runs once every bucket is reduced on this rank, with the first failure in reduction
 * order or GS_OK, on the progress thread (or at once here when all are done already; the rules
 * of gs_request_on_complete apply). GS_ERR_INVALID_ARGUMENT if some range was never marked
 * ready. The next gs_stream_begin, residual save / load and gs_stream_close may follow once fn
 * has been called. */
GS_API gs_status_t gs_stream_on_complete(gs_stream_t stream, gs_completion_fn fn, void* user_data);
/** Waits (bounded) for work in flight, then frees the stream. NULL is a no-op. */
GS_API gs_status_t gs_stream_close(gs_stream_t stream);
/** Error-feedback state, for checkpoints: its size, and a copy out / in (between iterations). */
GS_API gs_status_t gs_stream_residual_bytes(gs_stream_t stream, size_t* out_bytes);
GS_API gs_status_t gs_stream_save_residual(gs_stream_t stream, void* out, size_t bytes);
GS_API gs_status_t gs_stream_load_residual(gs_stream_t stream, const void* in, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* GRADSTREAM_GRADSTREAM_H_ */
