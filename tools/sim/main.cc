// gradstream-sim: runs the allreduce schedules of every algorithm on the cost model and prints
// predicted time, algbw and busbw per size (nccl-tests conventions), and where tree overtakes
// ring. Example:
//   gradstream-sim --ranks 1024,4096,16384 --per-host 8 --inter-gbps 400
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sim/simulate.h"

namespace {

using gs::stream::Algorithm;

[[noreturn]] void usage(const char* why) {
  if (why)
    fprintf(stderr, "gradstream-sim: %s\n\n", why);
  fprintf(stderr,
          "usage: gradstream-sim [--ranks N[,N...]] [--per-host L] [-b bytes] [-e bytes] [-f f]\n"
          "         [--inter-gbps G] [--inter-us A] [--intra-gbps G] [--intra-us A]\n"
          "         [--reduce-gbps G] [--chunk bytes] [--codec-ratio R] [--transport T]\n"
          "         [--cores C]\n"
          "  --transport T: take both link classes from the measured defaults of T (tcp, shm)\n"
          "  --cores C: CPUs per host (default: one per rank); fewer than --per-host prices the\n"
          "    crowded phases by the cost model's closed form\n"
          "  sizes accept K/M/G suffixes; defaults: 8 ranks, 8 per host, 8 B .. 1 GiB, x4\n");
  exit(why ? 2 : 0);
}

double parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (end == s)
    usage("bad number");
  if (*end == 'K' || *end == 'k')
    v *= 1024;
  else if (*end == 'M' || *end == 'm')
    v *= 1024 * 1024;
  else if (*end == 'G' || *end == 'g')
    v *= 1024.0 * 1024 * 1024;
  return v;
}

std::vector<int> parseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(atoi(p));
    const char* comma = strchr(p, ',');
    if (!comma)
      break;
    p = comma + 1;
  }
  return out;
}

std::string human(double bytes) {
  char buf[32];
  if (bytes >= 1 << 30)
    snprintf(buf, sizeof(buf), "%.0fG", bytes / (1 << 30));
  else if (bytes >= 1 << 20)
    snprintf(buf, sizeof(buf), "%.0fM", bytes / (1 << 20));
  else if (bytes >= 1 << 10)
    snprintf(buf, sizeof(buf), "%.0fK", bytes / (1 << 10));
  else
    snprintf(buf, sizeof(buf), "%.0f", bytes);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {8};
  int perHost = 8;
  int cores = 0;  // per host; 0: a core per rank
  double minBytes = 8, maxBytes = 1 << 30, factor = 4;
  gs::stream::CostModel model;
  model.intraHost = gs::stream::CostModel::measured("shm");
  model.interHost = gs::stream::LinkCost{5e-6, 1.0 / (400e9 / 8)};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help")
      usage(nullptr);
    if (i + 1 >= argc)
      usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    if (a == "--ranks")
      ranks = parseList(v);
    else if (a == "--per-host")
      perHost = atoi(v);
    else if (a == "--cores")
      cores = atoi(v);
    else if (a == "-b")
      minBytes = parseSize(v);
    else if (a == "-e")
      maxBytes = parseSize(v);
    else if (a == "-f")
      factor = atof(v);
    else if (a == "--inter-gbps")
      model.interHost.betaSecondsPerByte = 8 / (atof(v) * 1e9);
    else if (a == "--inter-us")
      model.interHost.alphaSeconds = atof(v) * 1e-6;
    else if (a == "--intra-gbps")
      model.intraHost.betaSecondsPerByte = 8 / (atof(v) * 1e9);
    else if (a == "--intra-us")
      model.intraHost.alphaSeconds = atof(v) * 1e-6;
    else if (a == "--reduce-gbps")
      model.gammaSecondsPerByte = 8 / (atof(v) * 1e9);
    else if (a == "--chunk")
      model.chunkBytes = parseSize(v);
    else if (a == "--codec-ratio")
      model.codecRatio = atof(v);
    else if (a == "--transport")
      model.intraHost = model.interHost = gs::stream::CostModel::measured(v);
    else
      usage(("unknown argument " + a).c_str());
  }
  if (perHost < 1 || factor <= 1 || minBytes < 1 || ranks.empty() || cores < 0)
    usage("bad arguments");
  for (int n : ranks) {
    if (n < 1 || n > 65536)
      usage("ranks must be in 1..65536");
    auto topo = gs::stream::Topology::blocks(n, perHost);
    if (cores > 0)
      topo.coresOf.assign(static_cast<size_t>(topo.hosts()), cores);
    printf(
        "# gradstream-sim: allreduce, %d ranks, %d per host (%d hosts); intra %.1f us %.1f GB/s, "
        "inter %.1f us %.1f GB/s, reduce %.1f GB/s, chunk %s, codec ratio %.2f%s\n",
        n, perHost, topo.hosts(), model.intraHost.alphaSeconds * 1e6,
        1e-9 / model.intraHost.betaSecondsPerByte, model.interHost.alphaSeconds * 1e6,
        1e-9 / model.interHost.betaSecondsPerByte, 1e-9 / model.gammaSecondsPerByte,
        human(model.chunkBytes).c_str(), model.codecRatio,
        cores > 0 ? (", " + std::to_string(cores) + " cores per host").c_str() : "");
    printf("# %10s %-17s %12s %11s %11s %s\n", "size(B)", "algorithm", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "how");
    double crossover = 0;
    bool treeWasFaster = false;
    for (double bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
      double ring = 0, tree = 0;
      for (Algorithm algo : gs::stream::kAlgorithms) {
        const auto p = gs::sim::simulateAllReduce(algo, topo, bytes, model);
        if (!(p.seconds < 1e30))
          continue;  // cannot run on this topology
        const double algbw = p.seconds > 0 ? bytes / p.seconds / 1e9 : 0;
        printf("  %10.0f %-17s %12.1f %11.3f %11.3f %s\n", bytes, gs::stream::algorithmName(algo),
               p.seconds * 1e6, algbw, algbw * 2 * (n - 1) / n,
               p.executed ? "schedules" : "closed form");
        if (algo == Algorithm::kRing)
          ring = p.seconds;
        if (algo == Algorithm::kTree)
          tree = p.seconds;
      }
      if (tree < ring)
        treeWasFaster = true;
      else if (treeWasFaster && crossover == 0)
        crossover = bytes;
      fflush(stdout);
    }
    if (crossover > 0)
      printf("# tree/ring crossover: ring is faster from %s bytes up\n", human(crossover).c_str());
    else
      printf("# tree/ring crossover: %s over the whole range\n",
             treeWasFaster ? "tree is faster" : "ring is faster");
  }
  return 0;
}
