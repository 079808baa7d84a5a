#pragma once

// gradstream-perf's command line: the options, their parsing, the names of dtypes and ops, and
// the exit statuses every part of the tool uses.

#include <stddef.h>

#include <string>

#include "gradstream/gradstream.h"

struct Options {
  size_t minBytes = 8, maxBytes = 128 << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  bool check = true;
  gs_dtype_t dtype = GS_FLOAT32;
  gs_redop_t op = GS_SUM;
  std::string coll = "allreduce";  // or reduce_scatter, allgather, broadcast, reduce, alltoall
  int root = 0;
  int ranks = 0;
  bool inPlace = false;
  bool registerBuffers = false;  // --register: gs_comm_register the buffers first
  int timeoutSeconds = 900;
  bool deviceBuffers = false;  // --device cuda
  std::string timeline;        // --timeline FILE
};

// Exit statuses; the launcher (--ranks) exits with the first non-zero one of its ranks.
constexpr int kExitUsage = 2;
constexpr int kExitCallFailed = 3;  // a gradstream or CUDA call failed
constexpr int kExitWrong = 4;       // results out of bounds
constexpr int kExitNoDevice = 5;    // --device cuda where CUDA cannot run

/// Prints why (if not null) and the usage, exits kExitUsage.
[[noreturn]] void usage(const char* why);
Options parseOptions(int argc, char** argv);
const char* dtypeName(gs_dtype_t d);
const char* opName(gs_redop_t o);
