/*
 * MPI peer: MPI_Allreduce(MPI_IN_PLACE, float, MPI_SUM) with gradstream-perf's flags and table
 * (see bench_common.h); --coll reduce runs MPI_Reduce to rank 0 instead, --coll alltoall
 * MPI_Alltoall (size: the whole send buffer, size/N bytes per peer, as gradstream-perf counts
 * it), --coll sendrecv MPI_Sendrecv to the next rank from the previous one (nccl-tests'
 * sendrecv pattern, as gradstream-perf runs it), --coll send MPI_Send from each even rank to
 * the next, MPI_Recv there (one way, as gradstream-perf's --coll send). The transport is
 * whatever mpirun selects; bench/peers.sh pins OpenMPI to TCP on lo:
 *
 *   mpirun --allow-run-as-root --oversubscribe --bind-to none -np N \
 *          --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo mpi_allreduce [flags]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  /* A failing call aborts the job (the default handler), so mpirun never waits on a dead rank. */
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  BenchArgs args;
  int* rest = malloc(sizeof(int) * (size_t)argc);
  int nrest = 0;
  const char* coll = "allreduce";
  int ok = bench_parse_args(argc, argv, &args, rest, &nrest);
  if (ok && nrest == 2 && strcmp(argv[rest[0]], "--coll") == 0) {
    coll = argv[rest[1]];
    nrest = 0;
  }
  const int reduce = strcmp(coll, "reduce") == 0, alltoall = strcmp(coll, "alltoall") == 0;
  const int sendrecv = strcmp(coll, "sendrecv") == 0, send = strcmp(coll, "send") == 0;
  if (!ok || nrest != 0 ||
      (!reduce && !alltoall && !sendrecv && !send && strcmp(coll, "allreduce") != 0) ||
      ((sendrecv || send) && n < 2)) {
    if (rank == 0)
      bench_usage(argv[0], NULL);
    free(rest);
    MPI_Finalize();
    return 2;
  }
  free(rest);

  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    char peer[MPI_MAX_LIBRARY_VERSION_STRING + 32];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    /* First line of the version string only ("Open MPI v4.1.4, package: ..."). */
    for (int i = 0; i < len; i++) {
      if (lib[i] == '\n' || lib[i] == ',') {
        lib[i] = '\0';
        break;
      }
    }
    snprintf(peer, sizeof peer, "%s (%s)",
             reduce     ? "MPI_Reduce"
             : alltoall ? "MPI_Alltoall"
             : sendrecv ? "MPI_Sendrecv"
             : send     ? "MPI_Send/MPI_Recv"
                        : "MPI_Allreduce",
             lib);
    bench_print_header(peer, &args, n);
  }

  const int total = args.warmup + args.iters;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n; /* sendrecv's peers */
  /* send: even ranks send to the next, odd ones receive; an odd last rank sits out. */
  const int sends = rank % 2 == 0 && rank + 1 < n, receives = rank % 2 == 1;
  double* times = malloc(sizeof(double) * (size_t)args.iters);
  for (size_t bytes = bench_next_size(&args, 0); bytes != 0;
       bytes = bench_next_size(&args, bytes)) {
    const size_t count = bytes / sizeof(float);
    if (count > (size_t)INT32_MAX) {
      if (rank == 0)
        fprintf(stderr, "mpi_allreduce: %zu B exceeds MPI's int count\n", bytes);
      break;
    }
    float* buf = calloc(count, sizeof(float));
    float* out = calloc(count + 1, sizeof(float));  /* reduce's root and alltoall's receive */
    const size_t block = count / (size_t)n;          /* alltoall: elements per peer */
    if (buf == NULL || out == NULL) {
      fprintf(stderr, "mpi_allreduce: out of memory at %zu B\n", bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    uint64_t wrong = 0;
    for (int it = 0; it < total; it++) {
      bench_fill(buf, count, rank);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = bench_now_us();
      if (reduce)
        MPI_Reduce(buf, out, (int)count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
      else if (alltoall)
        MPI_Alltoall(buf, (int)block, MPI_FLOAT, out, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
      else if (sendrecv)
        MPI_Sendrecv(buf, (int)count, MPI_FLOAT, next, 0, out, (int)count, MPI_FLOAT, prev, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      else if (send) { /* an odd last rank sits out */
        if (sends)
          MPI_Send(buf, (int)count, MPI_FLOAT, next, 0, MPI_COMM_WORLD);
        else if (receives)
          MPI_Recv(out, (int)count, MPI_FLOAT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t1 = bench_now_us();
      if (it < args.warmup)
        continue;
      times[it - args.warmup] = t1 - t0;
      if (args.check) {
        uint64_t w = 0;
        if (alltoall) {  /* block i from rank i: its elements r * block .. */
          for (int i = 0; i < n; i++) {
            for (size_t k = 0; k < block; k++)
              w += out[(size_t)i * block + k] != bench_value((size_t)rank * block + k, i);
          }
        } else if (sendrecv || (send && receives)) { /* the previous rank's buffer */
          for (size_t k = 0; k < count; k++)
            w += out[k] != bench_value(k, prev);
        } else if (!send && (!reduce || rank == 0)) { /* a sender has nothing to check */
          w = bench_count_wrong(reduce ? out : buf, count, n);
        }
        if (w > wrong)
          wrong = w;
      }
    }
    free(buf);
    free(out);
    MPI_Allreduce(MPI_IN_PLACE, times, args.iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
      bench_print_row(bytes, n, bench_median(times, args.iters), wrong, args.check);
  }
  free(times);

  long rss = bench_peak_rss_kb();
  MPI_Reduce(rank == 0 ? MPI_IN_PLACE : &rss, &rss, 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("# peak_rss_kb %ld  (max over ranks)\n", rss);
    fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
