// Gloo allreduce peer: float32 sum over gloo::transport::tcp on 127.0.0.1, one process per rank,
// with gradstream-perf's flags and table (see bench_common.h).
//
//   RANK=r WORLD_SIZE=N gloo_allreduce --store DIR [--algo ring|halving_doubling] [flags]
//
// All N processes must get the same --store (an empty directory on a shared filesystem; the
// rendezvous is gloo::rendezvous::FileStore) and --prefix. bench/peers.sh launches them.
//
// Algorithms (Debian's libgloo-dev, snapshot 2022-05-18, the one PyTorch 1.12/1.13 pairs with):
//   ring              gloo::allreduce() with AllreduceOptions, i.e. what PyTorch's gloo backend
//                     runs for dense CPU tensors (ring over unbound buffers, 1 MiB segments).
//   halving_doubling  gloo::AllreduceHalvingDoubling<float>, the older algorithm class; it owns
//                     scratch buffers sized to the message, so it is built once per size.

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

using Context = std::shared_ptr<gloo::Context>;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

struct Options {
  std::string algo = "ring";
  std::string store;
  std::string prefix = "gloo_allreduce";
  int rank = -1;
  int world = -1;
  int timeout_s = 120;
};

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// In-place allreduce of a few doubles, for gathering the per-iteration times and wrong counts.
void allreduceDoubles(const Context& ctx, std::vector<double>& v, ReduceFn fn) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(v.data(), v.size());
  opts.setReduceFunction(fn);
  gloo::allreduce(opts);
}

void barrier(const Context& ctx) {
  gloo::BarrierOptions opts(ctx);
  gloo::barrier(opts);
}

// The ring runs gloo::allreduce() with options rebuilt per call, as PyTorch's ProcessGroupGloo
// does for every collective.
void ringAllreduce(const Context& ctx, float* buf, size_t count) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(buf, count);
  opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
  gloo::allreduce(opts);
}

int benchMain(int argc, char** argv) {
  BenchArgs args;
  std::vector<int> rest(static_cast<size_t>(argc));
  int nrest = 0;
  const char* extra =
      " [--algo ring|halving_doubling] [--store DIR] [--prefix P]"
      " [--rank R] [--world N] [--timeout-s S]";
  if (!bench_parse_args(argc, argv, &args, rest.data(), &nrest)) {
    bench_usage(argv[0], extra);
    return 2;
  }
  Options o;
  o.rank = envInt("RANK", -1);
  o.world = envInt("WORLD_SIZE", -1);
  if (const char* s = std::getenv("GLOO_STORE_DIR"))
    o.store = s;
  for (int k = 0; k < nrest; k++) {
    std::string flag = argv[rest[k]];
    if (k + 1 >= nrest || rest[k + 1] != rest[k] + 1) {
      bench_usage(argv[0], extra);
      return 2;
    }
    std::string val = argv[rest[++k]];
    if (flag == "--algo")
      o.algo = val;
    else if (flag == "--store")
      o.store = val;
    else if (flag == "--prefix")
      o.prefix = val;
    else if (flag == "--rank")
      o.rank = std::atoi(val.c_str());
    else if (flag == "--world")
      o.world = std::atoi(val.c_str());
    else if (flag == "--timeout-s")
      o.timeout_s = std::atoi(val.c_str());
    else {
      bench_usage(argv[0], extra);
      return 2;
    }
  }
  if (o.algo != "ring" && o.algo != "halving_doubling") {
    std::fprintf(stderr, "gloo_allreduce: unknown --algo %s\n", o.algo.c_str());
    return 2;
  }
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world || o.store.empty()) {
    std::fprintf(stderr, "gloo_allreduce: need RANK, WORLD_SIZE (or --rank/--world) and --store\n");
    bench_usage(argv[0], extra);
    return 2;
  }

  // Bind to 127.0.0.1 explicitly (all traffic stays on loopback) unless GLOO_BIND names the
  // address of a network namespace the benchmark created (bench/codec_link.sh).
  const char* bind = std::getenv("GLOO_BIND");
  gloo::transport::tcp::attr attr(bind != nullptr && *bind != '\0' ? bind : "127.0.0.1");
  attr.ai_family = AF_INET;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fileStore(o.store);
  gloo::rendezvous::PrefixStore store(o.prefix, fileStore);
  auto rctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world);
  // The context timeout bounds every wait (rendezvous, each collective): a dead peer becomes an
  // exception rather than a hang.
  rctx->setTimeout(std::chrono::seconds(o.timeout_s));
  rctx->connectFullMesh(store, dev);
  Context ctx = rctx;

  const int n = o.world;
  if (o.rank == 0) {
    std::string peer = "gloo " + o.algo + " (libgloo " + std::to_string(GLOO_VERSION_MAJOR) + "." +
                       std::to_string(GLOO_VERSION_MINOR) + ", tcp 127.0.0.1)";
    bench_print_header(peer.c_str(), &args, n);
  }

  const int total = args.warmup + args.iters;
  std::vector<double> times(static_cast<size_t>(args.iters));
  for (size_t bytes = bench_next_size(&args, 0); bytes != 0;
       bytes = bench_next_size(&args, bytes)) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> buf(count);
    // Gloo's algorithm classes have noexcept(false) destructors, so they are held directly
    // rather than behind a common interface.
    std::unique_ptr<gloo::AllreduceHalvingDoubling<float>> hd;
    if (o.algo == "halving_doubling") {
      if (count > static_cast<size_t>(std::numeric_limits<int>::max())) {
        throw std::runtime_error("AllreduceHalvingDoubling takes an int count; " +
                                 std::to_string(bytes) + " B is too large");
      }
      hd = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
          ctx, std::vector<float*>{buf.data()}, static_cast<int>(count));
    }
    std::vector<double> wrong(1, 0.0);
    for (int it = 0; it < total; it++) {
      bench_fill(buf.data(), count, o.rank);
      barrier(ctx);
      double t0 = bench_now_us();
      if (hd) {
        hd->run();
      } else {
        ringAllreduce(ctx, buf.data(), count);
      }
      double t1 = bench_now_us();
      if (it < args.warmup)
        continue;
      times[static_cast<size_t>(it - args.warmup)] = t1 - t0;
      if (args.check) {
        wrong[0] = std::max(wrong[0], static_cast<double>(bench_count_wrong(buf.data(), count, n)));
      }
    }
    hd.reset();
    allreduceDoubles(ctx, times, static_cast<ReduceFn>(&gloo::max<double>));
    allreduceDoubles(ctx, wrong, static_cast<ReduceFn>(&gloo::sum<double>));
    if (o.rank == 0) {
      std::vector<double> sorted = times;
      double t = bench_median(sorted.data(), args.iters);
      bench_print_row(bytes, n, t, static_cast<uint64_t>(wrong[0]), args.check);
    }
  }

  std::vector<double> rss(1, static_cast<double>(bench_peak_rss_kb()));
  allreduceDoubles(ctx, rss, static_cast<ReduceFn>(&gloo::max<double>));
  barrier(ctx);
  if (o.rank == 0) {
    std::printf("# peak_rss_kb %.0f  (max over ranks)\n", rss[0]);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return benchMain(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce (pid %d): %s\n", static_cast<int>(getpid()), e.what());
    return 1;
  }
}
