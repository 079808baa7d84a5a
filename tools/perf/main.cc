// gradstream-perf: collective throughput in the style of nccl-tests.
//   gradstream-perf --ranks 4 -b 1M -e 256M -f 2 -n 20 -w 5 -c 1
// With --ranks N it starts N local processes itself; without it, it joins the ranks a launcher
// started (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or Slurm / Open MPI variables).
// --device cuda puts the buffers in CUDA device memory (perf/buffers.h): one loop and one check
// for both kinds, with the device's copies outside the timed region.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gradstream/gradstream.h"
#include "perf/buffers.h"
#include "perf/check.h"
#include "perf/launcher.h"
#include "perf/options.h"

namespace {

#define GS_TRY(call)                                                                \
  do {                                                                              \
    gs_status_t s_ = (call);                                                        \
    if (s_ != GS_OK) {                                                              \
      fprintf(stderr, "gradstream-perf: rank %d: %s failed: %s: %s\n", rank, #call, \
              gs_status_string(s_), gs_last_error());                               \
      exit(kExitCallFailed);                                                        \
    }                                                                               \
  } while (0)

int rank = -1;
// The bookkeeping collectives' buffers: fixed, so --register covers them too and the count of
// buffer registrations shows the measured collective's alone.
alignas(64) int64_t bookkeeping[4];

struct Bench {
  Options o;
  gs_comm_t comm;
  int nranks;
  size_t esize;
  Buffers& buffers;  // host views of send/recv; see perf/buffers.h

  // Elements per rank-side buffer for a message of `bytes` (nccl-tests: size is the larger
  // buffer, i.e. the full vector for allreduce/broadcast and N blocks for the others).
  size_t blockCount(size_t bytes) const {
    size_t count = bytes / esize;
    if (blockwise())
      count /= static_cast<size_t>(nranks);
    return count;
  }
  // The collectives whose larger buffer holds a block per rank.
  bool blockwise() const {
    return o.coll == "reduce_scatter" || o.coll == "allgather" || o.coll == "alltoall";
  }
  bool reduces() const {
    return o.coll == "allreduce" || o.coll == "reduce_scatter" || o.coll == "reduce";
  }
  bool rooted() const { return o.coll == "broadcast" || o.coll == "reduce"; }
  // sendrecv (nccl-tests' sendrecv_perf): every rank sends its buffer to the next rank and
  // receives the previous rank's, all pairs at once.
  int nextRank() const { return (rank + 1) % nranks; }
  int prevRank() const { return (rank + nranks - 1) % nranks; }
  // send (one way, as pipeline stages hand on activations): even rank r sends its buffer to
  // r + 1, which receives it; with an odd number of ranks the last one sits the calls out.
  bool sendsOneWay() const { return rank % 2 == 0 && rank + 1 < nranks; }
  bool receivesOneWay() const { return rank % 2 == 1; }

  // Both halves posted before either is waited for: a blocking gs_send completes only once the
  // peer's receive took the message, so send-then-recv on every rank would wait in a cycle.
  void sendRecvOnce(const void* send, void* recv, size_t count, CUstream_st* stream) {
    gs_request_t out = nullptr, in = nullptr;
    GS_TRY(gs_isend(send, count, o.dtype, nextRank(), comm, stream, &out));
    GS_TRY(gs_irecv(recv, count, o.dtype, prevRank(), comm, stream, &in));
    GS_TRY(gs_wait(out, -1));
    GS_TRY(gs_wait(in, -1));
    GS_TRY(gs_request_free(out));
    GS_TRY(gs_request_free(in));
  }

  void sendOneWay(const void* send, void* recv, size_t count, CUstream_st* stream) {
    if (sendsOneWay())
      GS_TRY(gs_send(send, count, o.dtype, rank + 1, comm, stream));
    else if (receivesOneWay())
      GS_TRY(gs_recv(recv, count, o.dtype, rank - 1, comm, stream));
  }

  // send and recv are host views. For device buffers the call returns with the result copies
  // enqueued on the stream; buffers.synchronize() waits for them.
  void runOnce(const uint8_t* sendView, uint8_t* recvView, size_t count) {
    const void* send = buffers.forCollective(sendView);
    void* recv = buffers.forCollective(recvView);
    CUstream_st* stream = buffers.stream();
    if (o.coll == "allreduce")
      GS_TRY(gs_allreduce(send, recv, count, o.dtype, o.op, comm, stream));
    else if (o.coll == "reduce_scatter")
      GS_TRY(gs_reduce_scatter(send, recv, count, o.dtype, o.op, comm, stream));
    else if (o.coll == "allgather")
      GS_TRY(gs_allgather(send, recv, count, o.dtype, comm, stream));
    else if (o.coll == "reduce")
      GS_TRY(gs_reduce(send, recv, count, o.dtype, o.op, o.root, comm, stream));
    else if (o.coll == "alltoall")
      GS_TRY(gs_alltoall(send, recv, count, o.dtype, comm, stream));
    else if (o.coll == "sendrecv")
      sendRecvOnce(send, recv, count, stream);
    else if (o.coll == "send")
      sendOneWay(send, recv, count, stream);
    else
      GS_TRY(gs_broadcast(send, recv, count, o.dtype, o.root, comm, stream));
  }

  // One collective whose result has reached the host view: the fill is uploaded first and the
  // checked range downloaded after (both nothing for host buffers).
  void runChecked(uint8_t* send,
                  size_t sendCount,
                  uint8_t* recv,
                  size_t count,
                  uint8_t* checked,
                  size_t checkedCount) {
    buffers.upload(send, sendCount * esize);
    runOnce(send, recv, count);
    buffers.download(checked, checkedCount * esize);
  }

  // The "# buffers:" header line. For device buffers it names the path the library reports
  // (gs_comm_stats_t.device_path), which is set once a collective on device memory ran: one
  // int32 allreduce (never encoded) in place on the receive buffer runs first, on every rank.
  std::string buffersLine() {
    std::string line = buffers.describe();
    if (!buffers.isDevice())
      return line;
    void* probe = buffers.forCollective(buffers.recv());
    GS_TRY(gs_allreduce(probe, probe, 1, GS_INT32, GS_SUM, comm, buffers.stream()));
    buffers.synchronize();
    gs_comm_stats_t st;
    memset(&st, 0, sizeof(st));
    st.struct_size = sizeof(st);
    GS_TRY(gs_comm_stats(comm, &st));
    std::string path = st.device_path;
    std::replace(path.begin(), path.end(), '_', ' ');
    return line + " (" + (path.empty() ? "the library reported no device path" : path) + ")";
  }

  // Bookkeeping collectives use integers: a lossy GS_CODEC never applies to them (integer
  // buffers always travel raw), so times and sizes are exact whatever codec is measured.
  void barrier() {
    bookkeeping[0] = 0;
    GS_TRY(gs_allreduce(&bookkeeping[0], &bookkeeping[1], 1, GS_INT32, GS_SUM, comm, nullptr));
  }

  // Max over ranks of a non-negative value, exact to a thousandth.
  double maxOverRanks(double v) {
    bookkeeping[2] = static_cast<int64_t>(v * 1000.0);
    GS_TRY(gs_allreduce(&bookkeeping[2], &bookkeeping[3], 1, GS_INT64, GS_MAX, comm, nullptr));
    return static_cast<double>(bookkeeping[3]) / 1000.0;
  }

  int64_t sumOverRanks(int64_t v) {
    bookkeeping[2] = v;
    GS_TRY(gs_allreduce(&bookkeeping[2], &bookkeeping[3], 1, GS_INT64, GS_SUM, comm, nullptr));
    return bookkeeping[3];
  }

  // Unchecked runs time the collective on the values a check would give it, not on the zeros
  // of fresh buffers: a lossy codec's work and a reduction's can depend on the values (a block
  // of zeros quantizes to a zero scale, top-k selects among equals).
  void fillInput(uint8_t* in, size_t count) {
    const size_t n = o.coll == "reduce_scatter" || o.coll == "alltoall" ? count * nranks : count;
    fillContribution(in, o.dtype, reduces() ? o.op : GS_SUM, rank, n, 0);
    buffers.upload(in, n * esize);
  }

  // Fills the inputs, runs once, and counts wrong elements on this rank.
  size_t check(uint8_t* sendBase, uint8_t* recv, size_t count) {
    const bool reduce = reduces();
    const gs_redop_t op = reduce ? o.op : GS_SUM;
    const double tol = o.op == GS_AVG && reduce ? (esize == 2 ? 1e-2 : 1e-6) : 0.0;
    uint8_t* send = o.inPlace ? inPlaceSend(sendBase, recv, count) : sendBase;
    if (o.coll == "allreduce") {
      fillContribution(send, o.dtype, op, rank, count, 0);
      runChecked(send, count, recv, count, recv, count);
      return countWrong(recv, o.dtype, count, 0, tol,
                        [&](size_t i) { return expectedReduction(o.dtype, op, nranks, i); });
    }
    if (o.coll == "reduce_scatter") {
      fillContribution(send, o.dtype, op, rank, count * nranks, 0);
      runChecked(send, count * nranks, recv, count, recv, count);
      return countWrong(recv, o.dtype, count, count * rank, tol,
                        [&](size_t i) { return expectedReduction(o.dtype, op, nranks, i); });
    }
    if (o.coll == "reduce") {  // the result exists on the root only
      fillContribution(send, o.dtype, op, rank, count, 0);
      runChecked(send, count, recv, count, recv, count);
      if (rank != o.root)
        return 0;
      return countWrong(recv, o.dtype, count, 0, tol,
                        [&](size_t i) { return expectedReduction(o.dtype, op, nranks, i); });
    }
    if (o.coll == "alltoall") {  // block i from rank i: its block for this rank
      fillContribution(send, o.dtype, GS_SUM, rank, count * nranks, 0);
      runChecked(send, count * nranks, recv, count, recv, count * nranks);
      size_t wrong = 0;
      for (int r = 0; r < nranks; ++r) {
        wrong += countWrong(recv + count * esize * r, o.dtype, count, count * rank, 0,
                            [&](size_t i) { return contribution(GS_SUM, r, i); });
      }
      return wrong;
    }
    if (o.coll == "sendrecv") {  // the previous rank's buffer
      fillContribution(send, o.dtype, GS_SUM, rank, count, 0);
      runChecked(send, count, recv, count, recv, count);
      return countWrong(recv, o.dtype, count, 0, 0,
                        [&](size_t i) { return contribution(GS_SUM, prevRank(), i); });
    }
    if (o.coll == "send") {  // an odd rank holds its even neighbour's buffer
      fillContribution(send, o.dtype, GS_SUM, rank, count, 0);
      runChecked(send, count, recv, count, recv, receivesOneWay() ? count : 0);
      if (!receivesOneWay())
        return 0;
      return countWrong(recv, o.dtype, count, 0, 0,
                        [&](size_t i) { return contribution(GS_SUM, rank - 1, i); });
    }
    if (o.coll == "allgather") {
      fillContribution(send, o.dtype, GS_SUM, rank, count, 0);
      runChecked(send, count, recv, count, recv, count * nranks);
      size_t wrong = 0;
      for (int r = 0; r < nranks; ++r) {
        wrong += countWrong(recv + count * esize * r, o.dtype, count, 0, 0,
                            [&](size_t i) { return contribution(GS_SUM, r, i); });
      }
      return wrong;
    }
    fillContribution(send, o.dtype, GS_SUM, rank, count, 0);
    runChecked(send, count, recv, count, recv, count);
    return countWrong(recv, o.dtype, count, 0, 0,
                      [&](size_t i) { return contribution(GS_SUM, o.root, i); });
  }

  uint8_t* inPlaceSend(uint8_t* sendBase, uint8_t* recv, size_t count) {
    (void)sendBase;
    if (o.coll == "reduce_scatter")
      return recv;  // recv is then the N-block buffer, see run()
    if (o.coll == "allgather")
      return recv + count * esize * rank;
    return recv;
  }

  void run() {
    // Per-iteration times for tests that line them up with events (rate changes, decisions).
    std::unique_ptr<FILE, int (*)(FILE*)> timeline(nullptr, fclose);
    if (!o.timeline.empty()) {
      const std::string path = o.timeline + "." + std::to_string(rank);
      timeline.reset(fopen(path.c_str(), "a"));
      if (timeline == nullptr) {
        fprintf(stderr, "gradstream-perf: --timeline: cannot open %s: %s\n", path.c_str(),
                strerror(errno));
        exit(kExitUsage);
      }
    }
    printf("# gradstream-perf: %s, %d ranks, dtype %s, op %s, %s, %d iterations after %d warm-up\n",
           o.coll.c_str(), nranks, dtypeName(o.dtype), opName(o.op),
           o.inPlace ? "in place" : "out of place", o.iters, o.warmup);
    // What carries rank 0's links (GS_TRANSPORT, and shm between ranks of one host: GS_SHM).
    gs_comm_stats_t initial;
    memset(&initial, 0, sizeof(initial));
    initial.struct_size = sizeof(initial);
    printf("# transport: %s\n", gs_comm_stats(comm, &initial) == GS_OK ? initial.transport : "?");
    printf("# buffers: %s\n", buffersLine().c_str());
    printf(
        "# time is the median over iterations of the slowest rank, each iteration after a "
        "barrier\n");
    printf("# %10s %12s %8s %6s %5s %11s %11s %11s %7s %s\n", "size(B)", "count", "type", "redop",
           "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "algo");
    fflush(stdout);
    int64_t totalWrong = 0;
    for (size_t bytes = o.minBytes; bytes <= o.maxBytes;) {
      const size_t count = blockCount(bytes);
      const size_t sizeBytes = blockwise() ? count * esize * nranks : count * esize;
      uint8_t* send = buffers.send();
      uint8_t* recv = buffers.recv();
      if (o.inPlace && o.coll == "reduce_scatter") {
        // In place: the N-block input is the receive buffer; this rank's output is block `rank`.
        send = buffers.recv();
        recv = buffers.recv() + count * esize * rank;
      }
      int64_t wrong = 0;
      if (o.check) {
        wrong = static_cast<int64_t>(o.coll == "reduce_scatter" && o.inPlace
                                         ? checkReduceScatterInPlace(send, count)
                                         : check(send, recv, count));
      }
      const uint8_t* in = o.inPlace ? inPlaceSend(send, recv, count) : send;
      if (o.inPlace && o.coll == "reduce_scatter")
        in = send;
      if (!o.check)
        fillInput(const_cast<uint8_t*>(in), count);
      for (int i = 0; i < o.warmup; ++i)
        runOnce(in, recv, count);
      buffers.synchronize();
      std::vector<double> times;
      for (int i = 0; i < o.iters; ++i) {
        barrier();
        auto t0 = std::chrono::steady_clock::now();
        runOnce(in, recv, count);
        buffers.synchronize();  // end to end: the result is in recv (device memory included)
        auto t1 = std::chrono::steady_clock::now();
        times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        if (timeline != nullptr) {
          fprintf(timeline.get(), "%zu %.6f %.3f\n", sizeBytes,
                  std::chrono::duration<double>(t1.time_since_epoch()).count(), times.back());
        }
      }
      // The schedule the library chose (GS_ALGO, cost model) for the last timed iteration, read
      // before the tool's own bookkeeping collectives below replace it.
      gs_comm_stats_t st;
      memset(&st, 0, sizeof(st));
      st.struct_size = sizeof(st);
      const char* algo =
          gs_comm_stats(comm, &st) == GS_OK && st.last_algorithm[0] ? st.last_algorithm : "-";
      std::sort(times.begin(), times.end());
      const double us = maxOverRanks(times[times.size() / 2]);
      wrong = sumOverRanks(wrong);
      totalWrong += wrong;
      const double algbw = us > 0 ? static_cast<double>(sizeBytes) / us / 1e3 : 0;
      // nccl-tests' bus bandwidth factors; sendrecv and send move each byte over one link once.
      const double factor = o.coll == "allreduce" ? 2.0 * (nranks - 1) / nranks
                            : rooted() || o.coll == "sendrecv" || o.coll == "send"
                                ? 1.0
                                : static_cast<double>(nranks - 1) / nranks;
      if (rank == 0) {
        printf("  %10zu %12zu %8s %6s %5d %11.1f %11.3f %11.3f %7lld %s\n", sizeBytes,
               sizeBytes / esize, dtypeName(o.dtype), reduces() ? opName(o.op) : "none",
               rooted() ? o.root : -1, us, algbw, algbw * factor, static_cast<long long>(wrong),
               algo);
        fflush(stdout);
      }
      const size_t next = static_cast<size_t>(static_cast<double>(bytes) * o.factor);
      bytes = next > bytes ? next : bytes + 1;
    }
    // Registrations of the buffers with the transports (verbs pins pages at each): once per
    // plan with --register, at every call on verbs without it.
    gs_comm_stats_t end;
    memset(&end, 0, sizeof(end));
    end.struct_size = sizeof(end);
    GS_TRY(gs_comm_stats(comm, &end));
    const double regs = maxOverRanks(static_cast<double>(end.buffer_registrations));
    // Bytes copied straight out of a same-host peer's memory (GS_SHM_SINGLE_COPY).
    const double singleCopy = maxOverRanks(static_cast<double>(end.single_copy_bytes));
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double rss = maxOverRanks(static_cast<double>(ru.ru_maxrss));
    if (rank == 0) {
      printf("# peak_rss_kb %.0f\n", rss);
      printf("# buffer_registrations %.0f (most of any rank)%s\n", regs,
             o.registerBuffers ? " with --register" : "");
      printf("# single_copy_bytes %.0f (most of any rank)\n", singleCopy);
      printf("# Out of bounds values : %lld %s\n", static_cast<long long>(totalWrong),
             totalWrong == 0 ? "OK" : "FAILED");
    }
    if (totalWrong != 0)
      exit(kExitWrong);
  }

  size_t checkReduceScatterInPlace(uint8_t* buf, size_t count) {
    const gs_redop_t op = o.op;
    const double tol = op == GS_AVG ? (esize == 2 ? 1e-2 : 1e-6) : 0.0;
    fillContribution(buf, o.dtype, op, rank, count * nranks, 0);
    uint8_t* out = buf + count * esize * rank;
    runChecked(buf, count * nranks, out, count, out, count);
    return countWrong(out, o.dtype, count, count * rank, tol,
                      [&](size_t i) { return expectedReduction(o.dtype, op, nranks, i); });
  }
};

// This rank's index among the ranks on its host, as launchers set it (the --ranks launcher sets
// LOCAL_RANK); the global rank where none is set.
int localRank(int globalRank) {
  for (const char* name : {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    const char* v = getenv(name);
    if (v != nullptr && *v != '\0')
      return atoi(v);
  }
  return globalRank;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parseOptions(argc, argv);
  // Refused before any rank starts (and again by each rank a launcher started), naming why.
  if (o.deviceBuffers) {
    const std::string why = cudaUnavailableReason();
    if (!why.empty()) {
      fprintf(stderr, "gradstream-perf: --device cuda cannot run: %s\n", why.c_str());
      return kExitNoDevice;
    }
  }
  if (o.ranks > 0 && getenv("RANK") == nullptr)
    return launchLocalRanks(o.ranks, argv, o.timeoutSeconds);

  gs_comm_t comm = nullptr;
  GS_TRY(gs_comm_init_from_env(&comm, nullptr));
  int nranks = 0;
  GS_TRY(gs_comm_rank(comm, &rank));
  GS_TRY(gs_comm_size(comm, &nranks));
  if (o.root < 0 || o.root >= nranks)
    usage("root out of range");
  const bool messages = o.coll == "sendrecv" || o.coll == "send";
  if (messages && nranks < 2)
    usage(
        ("--coll " + o.coll + " needs two ranks or more (a rank does not message itself)").c_str());
  if (messages && o.inPlace)
    usage(("--coll " + o.coll +
           " cannot run in place (the message received would overwrite the one being sent)")
              .c_str());
  if (rank != 0) {
    // Only rank 0 prints the table.
    if (!freopen("/dev/null", "w", stdout))
      return 1;
  }
  const size_t esize = dtypeSize(o.dtype);
  const size_t maxElems = o.maxBytes / esize + nranks;
  // In place needs one buffer; out of place two (so peak memory compares with the peers).
  const size_t recvBytes = maxElems * esize + 64, sendBytes = o.inPlace ? 0 : recvBytes;
  std::unique_ptr<Buffers> buffers;
  try {
    buffers = o.deviceBuffers ? makeCudaBuffers(localRank(rank), recvBytes, sendBytes)
                              : makeHostBuffers(recvBytes, sendBytes);
    Bench b{o, comm, nranks, esize, *buffers};
    void* registered[3] = {nullptr, nullptr, nullptr};
    if (o.registerBuffers) {
      GS_TRY(gs_comm_register(comm, bookkeeping, sizeof(bookkeeping), &registered[2]));
      GS_TRY(gs_comm_register(comm, buffers->forCollective(buffers->recv()), recvBytes,
                              &registered[0]));
      if (sendBytes > 0) {
        GS_TRY(gs_comm_register(comm, buffers->forCollective(buffers->send()), sendBytes,
                                &registered[1]));
      }
    }
    b.run();
    for (void* h : registered) {
      if (h != nullptr)
        GS_TRY(gs_comm_deregister(comm, h));
    }
  } catch (const std::exception& e) {  // CUDA calls of the device buffers
    fprintf(stderr, "gradstream-perf: rank %d: %s\n", rank, e.what());
    exit(kExitCallFailed);
  }
  GS_TRY(gs_comm_destroy(comm));
  buffers.reset();  // after the communicator, whose last staging copies ran on their stream
  return 0;
}
