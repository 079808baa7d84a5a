// gradstream-perf's command line (see usage()).
#include "perf/options.h"

#include <stdio.h>
#include <stdlib.h>

[[noreturn]] void usage(const char* why) {
  if (why)
    fprintf(stderr, "gradstream-perf: %s\n\n", why);
  fprintf(stderr,
          "usage: gradstream-perf [--ranks N] [-b bytes] [-e bytes] [-f factor] [-n iters]\n"
          "       [-w warmup] [-c 0|1] [-d float32|float16|bfloat16|float64|int32|int64|uint8]\n"
          "       [-o sum|avg|min|max|prod] [--coll allreduce|reduce_scatter|allgather|\n"
          "       broadcast|reduce|alltoall|sendrecv|send] [-r root] [--inplace]\n"
          "       [--timeout seconds] [--device host|cuda] [--timeline FILE] [--register]\n"
          "Sizes take K/M/G suffixes. Transport and tuning come from GS_* variables.\n"
          "--coll sendrecv: every rank sends to the next and receives from the previous (a ring);\n"
          "       send: one way, even rank r sends to r + 1 (an odd last rank sits out).\n"
          "--device cuda: send/recv buffers in CUDA device memory (device LOCAL_RANK mod the\n"
          "       device count), one stream per rank given to the collectives; each timed\n"
          "       iteration includes the stream synchronization, so the time is until the result\n"
          "       is in device memory. Filling and checking copy outside the timed region.\n"
          "--register: gs_comm_register the send and receive buffers before the first call (their\n"
          "       transport registrations then last across calls, see buffer_registrations).\n"
          "--timeline FILE: each rank appends a line per timed iteration to FILE.<rank>: bytes,\n"
          "       steady-clock (CLOCK_MONOTONIC) seconds at its end, its time in us.\n"
          "Exit status: 0 ok, 2 bad arguments, 3 a gradstream or CUDA call failed, 4 wrong\n"
          "       results, 5 --device cuda where CUDA cannot run, 124 ranks over --timeout.\n");
  exit(kExitUsage);
}

namespace {

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (end == s || v < 0)
    usage("bad size");
  switch (*end) {
    case 'k':
    case 'K':
      v *= 1024;
      break;
    case 'm':
    case 'M':
      v *= 1024 * 1024;
      break;
    case 'g':
    case 'G':
      v *= 1024.0 * 1024 * 1024;
      break;
    case '\0':
      break;
    default:
      usage("bad size suffix");
  }
  return static_cast<size_t>(v);
}

gs_dtype_t parseDtype(const std::string& s) {
  static const char* names[] = {"float32", "float16", "bfloat16", "float64",
                                "int32",   "int64",   "uint8"};
  for (int i = 0; i < 7; ++i) {
    if (s == names[i])
      return static_cast<gs_dtype_t>(i);
  }
  if (s == "float" || s == "fp32")
    return GS_FLOAT32;
  if (s == "half" || s == "fp16")
    return GS_FLOAT16;
  if (s == "bf16")
    return GS_BFLOAT16;
  usage("unknown dtype");
}

}  // namespace

const char* dtypeName(gs_dtype_t d) {
  static const char* names[] = {"float32", "float16", "bfloat16", "float64",
                                "int32",   "int64",   "uint8"};
  return names[d];
}

namespace {

gs_redop_t parseOp(const std::string& s) {
  static const char* names[] = {"sum", "avg", "min", "max", "prod"};
  for (int i = 0; i < 5; ++i) {
    if (s == names[i])
      return static_cast<gs_redop_t>(i);
  }
  usage("unknown op");
}

}  // namespace

const char* opName(gs_redop_t o) {
  static const char* names[] = {"sum", "avg", "min", "max", "prod"};
  return names[o];
}

Options parseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc)
        usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "-b" || a == "--minbytes")
      o.minBytes = parseSize(next());
    else if (a == "-e" || a == "--maxbytes")
      o.maxBytes = parseSize(next());
    else if (a == "-f" || a == "--stepfactor")
      o.factor = atof(next());
    else if (a == "-n" || a == "--iters")
      o.iters = atoi(next());
    else if (a == "-w" || a == "--warmup_iters")
      o.warmup = atoi(next());
    else if (a == "-c" || a == "--check")
      o.check = atoi(next()) != 0;
    else if (a == "-d" || a == "--datatype")
      o.dtype = parseDtype(next());
    else if (a == "-o" || a == "--op")
      o.op = parseOp(next());
    else if (a == "-r" || a == "--root")
      o.root = atoi(next());
    else if (a == "--coll")
      o.coll = next();
    else if (a == "--ranks")
      o.ranks = atoi(next());
    else if (a == "--inplace")
      o.inPlace = true;
    else if (a == "--timeout")
      o.timeoutSeconds = atoi(next());
    else if (a == "--device") {
      const std::string d = next();
      if (d != "host" && d != "cuda")
        usage("--device takes host or cuda");
      o.deviceBuffers = d == "cuda";
    } else if (a == "--register") {
      o.registerBuffers = true;
    } else if (a == "--timeline")
      o.timeline = next();
    else if (a == "-h" || a == "--help")
      usage(nullptr);
    else
      usage(("unknown argument " + a).c_str());
  }
  if (o.factor <= 1 || o.iters < 1 || o.warmup < 0 || o.minBytes > o.maxBytes)
    usage("bad sweep");
  if (o.coll != "allreduce" && o.coll != "reduce_scatter" && o.coll != "allgather" &&
      o.coll != "broadcast" && o.coll != "reduce" && o.coll != "alltoall" && o.coll != "sendrecv" &&
      o.coll != "send") {
    usage("unknown collective");
  }
  return o;
}
