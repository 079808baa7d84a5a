/*
 * gs-integ-rank: one rank of a multi-process integration test, using only the public C API.
 *
 *   RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p GS_SECRET=s gs-integ-rank loop <count> <iters>
 *
 * Joins with gs_comm_init_from_env, then runs <iters> float32 sum allreduces of <count>
 * elements (iters 0: until a call fails), checking every result. Progress goes to stdout as
 * "rank=<r> iter=<i> ok" lines (the first one, "READY rank=<r> nranks=<n> transport=<t>", once
 * the communicator is up; t as in gs_comm_stats_t.transport).
 * The last line on stdout is always
 *
 *   RESULT rank=<r> status=<GS_...|MISMATCH|USAGE> message=<gs_last_error() or the mismatch>
 *
 * and the exit code is 0 on success, -status (1..8) for a failed gs_* call, 9 for a wrong
 * result and 2 for bad usage. rank is -1 when the communicator never came up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* gradstream.h names struct CUstream_st only inside parameter lists, which in C gives every
 * prototype its own incompatible type (and a warning per prototype). Declaring it at file scope
 * first, as a C user with cuda.h would, keeps this file warning-free (GS_WERROR). */
struct CUstream_st;
#include "gradstream/gradstream.h"

static int g_rank = -1;

/* Prints the RESULT line for a failed (or successful) gs_* call and returns the exit code. */
static int finish(gs_status_t s, const char* what) {
  const char* message = s == GS_OK ? "" : gs_last_error();
  /* One line: the message must not break the RESULT line apart. */
  printf("RESULT rank=%d status=%s message=", g_rank, gs_status_string(s));
  for (const char* c = message; *c; ++c)
    putchar(*c == '\n' ? ' ' : *c);
  putchar('\n');
  if (s != GS_OK)
    fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, what, gs_status_string(s), message);
  fflush(stdout);
  return s == GS_OK ? 0 : -(int)s;
}

static int usage(void) {
  fprintf(stderr, "usage: gs-integ-rank loop <count> <iters>\n");
  printf("RESULT rank=-1 status=USAGE message=bad arguments\n");
  return 2;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 4 || strcmp(argv[1], "loop") != 0)
    return usage();
  char* end = NULL;
  const long long count_ll = strtoll(argv[2], &end, 10);
  if (*end != '\0' || count_ll < 1)
    return usage();
  const long long iters = strtoll(argv[3], &end, 10);
  if (*end != '\0' || iters < 0)
    return usage();
  const size_t count = (size_t)count_ll;

  gs_comm_t comm = NULL;
  gs_status_t s = gs_comm_init_from_env(&comm, NULL);
  if (s != GS_OK)
    return finish(s, "gs_comm_init_from_env");
  int nranks = 0;
  if ((s = gs_comm_rank(comm, &g_rank)) != GS_OK)
    return finish(s, "gs_comm_rank");
  if ((s = gs_comm_size(comm, &nranks)) != GS_OK)
    return finish(s, "gs_comm_size");
  gs_comm_stats_t st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  if ((s = gs_comm_stats(comm, &st)) != GS_OK)
    return finish(s, "gs_comm_stats");
  printf("READY rank=%d nranks=%d transport=%s\n", g_rank, nranks, st.transport);

  float* send = (float*)malloc(count * sizeof(float));
  float* recv = (float*)malloc(count * sizeof(float));
  if (!send || !recv) {
    printf("RESULT rank=%d status=GS_ERR_NO_MEMORY message=malloc failed\n", g_rank);
    return 3;
  }
  /* Small integers, exact in float32: rank r contributes (r + 1) + (i + it) % 7. */
  for (long long it = 0; iters == 0 || it < iters; ++it) {
    for (size_t i = 0; i < count; ++i)
      send[i] = (float)(g_rank + 1) + (float)((i + (size_t)it) % 7);
    memset(recv, 0xff, count * sizeof(float));
    s = gs_allreduce(send, recv, count, GS_FLOAT32, GS_SUM, comm, NULL);
    if (s != GS_OK) {
      int code = finish(s, "gs_allreduce");
      /* A failed communicator is still destroyed (not collective); its status is not the point. */
      gs_comm_destroy(comm);
      return code;
    }
    const float base = (float)nranks * (float)(nranks + 1) / 2.0f;
    for (size_t i = 0; i < count; ++i) {
      const float want = base + (float)nranks * (float)((i + (size_t)it) % 7);
      if (recv[i] != want) {
        printf(
            "RESULT rank=%d status=MISMATCH message=iteration %lld element %zu is %g, expected "
            "%g\n",
            g_rank, it, i, (double)recv[i], (double)want);
        return 9;
      }
    }
    printf("rank=%d iter=%lld ok\n", g_rank, it);
  }
  free(send);
  free(recv);
  s = gs_comm_destroy(comm);
  return finish(s, "gs_comm_destroy");
}
