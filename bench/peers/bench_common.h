/*
 * Shared by the peer benchmarks (gloo_allreduce.cc, mpi_allreduce.c): the gradstream-perf
 * command line, the size sweep, data fill and check, and the nccl-tests-style table.
 *
 * Plain C99 so the MPI peer can be built with mpicc; everything is static inline, one copy per
 * program. Nothing here talks to the network: the callers pass in the reductions they need.
 */
#ifndef GS_BENCH_PEERS_COMMON_H
#define GS_BENCH_PEERS_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct {
  size_t min_bytes; /* -b */
  size_t max_bytes; /* -e */
  double factor;    /* -f, multiplicative step */
  int iters;        /* -n, timed iterations per size */
  int warmup;       /* -w, untimed iterations per size */
  int check;        /* -c, 1 = verify every timed iteration element by element */
} BenchArgs;

/* "64", "1K", "16M", "1G" (binary multiples, as nccl-tests). Returns 0 on a malformed value. */
static inline int bench_parse_size(const char* s, size_t* out) {
  char* end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno != 0 || end == s || v < 0)
    return 0;
  double mult = 1;
  switch (*end) {
    case 'k':
    case 'K':
      mult = 1024.0;
      end++;
      break;
    case 'm':
    case 'M':
      mult = 1024.0 * 1024.0;
      end++;
      break;
    case 'g':
    case 'G':
      mult = 1024.0 * 1024.0 * 1024.0;
      end++;
      break;
    default:
      break;
  }
  if (*end == 'B' || *end == 'b')
    end++;
  if (*end != '\0')
    return 0;
  *out = (size_t)(v * mult);
  return 1;
}

static inline void bench_usage(const char* prog, const char* extra) {
  fprintf(stderr,
          "usage: %s [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-c 0|1]%s\n"
          "  sizes take K/M/G suffixes (binary); defaults -b 1M -e 256M -f 4 -n 20 -w 5 -c 1\n",
          prog, extra ? extra : "");
}

/*
 * Parses the shared flags from argv. Arguments it does not know are left for the caller: their
 * indices are returned in rest[] (rest must hold argc entries), their number in *nrest.
 * Returns 0 on a malformed shared flag.
 */
static inline int bench_parse_args(int argc, char** argv, BenchArgs* a, int* rest, int* nrest) {
  a->min_bytes = 1u << 20;
  a->max_bytes = 256u << 20;
  a->factor = 4;
  a->iters = 20;
  a->warmup = 5;
  a->check = 1;
  *nrest = 0;
  for (int i = 1; i < argc; i++) {
    const char* f = argv[i];
    int known = f[0] == '-' && f[1] != '\0' && f[2] == '\0' && strchr("befnwc", f[1]) != NULL;
    if (!known) {
      rest[(*nrest)++] = i;
      continue;
    }
    if (i + 1 >= argc)
      return 0;
    const char* v = argv[++i];
    char* end = NULL;
    switch (f[1]) {
      case 'b':
        if (!bench_parse_size(v, &a->min_bytes))
          return 0;
        break;
      case 'e':
        if (!bench_parse_size(v, &a->max_bytes))
          return 0;
        break;
      case 'f':
        a->factor = strtod(v, &end);
        if (*end || a->factor <= 1)
          return 0;
        break;
      case 'n':
        a->iters = (int)strtol(v, &end, 10);
        if (*end || a->iters < 1)
          return 0;
        break;
      case 'w':
        a->warmup = (int)strtol(v, &end, 10);
        if (*end || a->warmup < 0)
          return 0;
        break;
      case 'c':
        a->check = (int)strtol(v, &end, 10);
        if (*end)
          return 0;
        break;
    }
  }
  if (a->min_bytes < sizeof(float))
    a->min_bytes = sizeof(float);
  return a->min_bytes <= a->max_bytes;
}

/* Next size of the sweep; 0 when past max. Sizes are multiples of sizeof(float). */
static inline size_t bench_next_size(const BenchArgs* a, size_t cur) {
  size_t next = cur == 0 ? a->min_bytes : (size_t)((double)cur * a->factor);
  if (next == cur)
    next = cur + sizeof(float);
  next -= next % sizeof(float);
  return next <= a->max_bytes ? next : 0;
}

/*
 * Input of rank r: small integers, so every reduction order gives the exact sum in fp32
 * (|sum| <= 512 * N < 2^24) and a wrong, dropped or duplicated contribution shows.
 */
static inline float bench_value(size_t i, int rank) {
  return (float)((int)((i * 7u + (size_t)rank * 131u) % 1021u) - 510);
}

static inline void bench_fill(float* buf, size_t count, int rank) {
  for (size_t i = 0; i < count; i++)
    buf[i] = bench_value(i, rank);
}

/* Number of elements differing from the exact sum over all ranks. */
static inline uint64_t bench_count_wrong(const float* buf, size_t count, int nranks) {
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < nranks; r++)
      want += bench_value(i, r);
    wrong += buf[i] != want;
  }
  return wrong;
}

static inline double bench_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int bench_cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

/* Median of v[0..n); sorts v. */
static inline double bench_median(double* v, int n) {
  qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline long bench_peak_rss_kb(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss; /* kilobytes on Linux */
}

static inline void bench_print_header(const char* peer, const BenchArgs* a, int nranks) {
  printf("# %s: allreduce float32 sum, in place, %d ranks, one process per rank\n", peer, nranks);
  printf("# -b %zu -e %zu -f %g -n %d -w %d -c %d\n", a->min_bytes, a->max_bytes, a->factor,
         a->iters, a->warmup, a->check);
  printf("# time: median over -n iterations of the slowest rank's time; each iteration is\n");
  printf("#   preceded by a barrier and by refilling the input (neither timed)\n");
  printf("# algbw = size/time (GB = 1e9 B), busbw = algbw * 2(N-1)/N\n");
  printf(
      "# #wrong: elements differing from the exact sum (each rank its worst iteration, summed)\n");
  printf("#\n");
  printf("# %10s %12s %8s %6s %5s %12s %12s %12s %8s\n", "size(B)", "count", "type", "redop",
         "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  fflush(stdout);
}

static inline void bench_print_row(
    size_t bytes, int nranks, double time_us, uint64_t wrong, int checked) {
  double algbw = (double)bytes / (time_us * 1e3);
  double busbw = algbw * 2.0 * (nranks - 1) / nranks;
  char wrong_s[24];
  if (checked) {
    snprintf(wrong_s, sizeof wrong_s, "%llu", (unsigned long long)wrong);
  } else {
    snprintf(wrong_s, sizeof wrong_s, "N/A");
  }
  printf("  %10zu %12zu %8s %6s %5d %12.2f %12.3f %12.3f %8s\n", bytes, bytes / sizeof(float),
         "float32", "sum", -1, time_us, algbw, busbw, wrong_s);
  fflush(stdout);
}

#endif /* GS_BENCH_PEERS_COMMON_H */
