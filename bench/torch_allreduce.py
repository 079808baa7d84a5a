#!/usr/bin/env python3
"""dist.all_reduce of float32 tensors through torch.distributed, one process per rank.

Started by bench/torch_peers.sh (N processes with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT); rank 0 prints gradstream-perf's table (busbw from the median over iterations of
the slowest rank's time, each iteration after a barrier), then the 8 B per-call latency.

  torch_allreduce.py --backend gloo|gradstream [-b 1M] [-e 256M] [-f 4] [-n 20] [-w 5]
                     [--big-from 64M --big-n 5 --big-w 2] [--lat-n 2000] [-c 0|1]

Bookkeeping (the barrier before each iteration, the max over ranks of the times, the #wrong
sum) runs on a separate Gloo group, the same for both backends, so the backend under test only
carries the timed all_reduce calls. Inputs are small integers (index mod 13 + rank), so every
reduction order gives the exact sum; -c 1 compares every element of every timed iteration.
"""
import argparse
import datetime
import os
import resource
import statistics
import sys
import time

from torch_job import Job


def to_bytes(s):
    s = str(s).strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def sweep(b, e, f):
    """The sizes of gradstream-perf's sweep (bench_common.h's bench_next_size)."""
    s = max(b, 4)
    s -= s % 4
    out = []
    while s <= e and len(out) < 64:
        out.append(s)
        n = int(s * f)
        if n == s:
            n = s + 4
        s = n - n % 4
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", required=True, choices=["gloo", "gradstream"])
    ap.add_argument("-b", default="1M")
    ap.add_argument("-e", default="256M")
    ap.add_argument("-f", type=float, default=4)
    ap.add_argument("-n", type=int, default=20, help="timed iterations below --big-from")
    ap.add_argument("-w", type=int, default=5, help="warm-up iterations below --big-from")
    ap.add_argument("--big-from", default="64M")
    ap.add_argument("--big-n", type=int, default=5)
    ap.add_argument("--big-w", type=int, default=2)
    ap.add_argument("--lat-n", type=int, default=2000, help="8 B calls timed (0: none)")
    ap.add_argument("--lat-w", type=int, default=100)
    ap.add_argument("-c", type=int, default=1, choices=[0, 1], help="check every element")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--timeout", type=float, default=300, help="process group timeout, s")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    gs = None
    if a.backend == "gradstream":
        import gradstream.torch as gs  # registers the backend
    job = Job(a.backend, a.timeout)
    rank, world, side, t_init = job.rank, job.world, job.side, job.init_seconds
    out, max_over_ranks = job.out, job.max_over_ranks

    busf = 2.0 * (world - 1) / world
    big = to_bytes(a.big_from)
    out(f"# torch_allreduce.py backend={a.backend} N={world} torch {torch.__version__} "
        f"threads={a.threads} init {t_init:.2f} s; GS_SHM={os.environ.get('GS_SHM', '-')}")
    out("#    size(B)        count     type  redop  root     time(us)  algbw(GB/s)  busbw(GB/s)"
        "   #wrong")
    transport_printed = False
    chunk = 1 << 22
    for size in sweep(to_bytes(a.b), to_bytes(a.e), a.f):
        iters, warm = (a.big_n, a.big_w) if size >= big else (a.n, a.w)
        count = size // 4
        src = torch.empty(count, dtype=torch.float32)
        for lo in range(0, count, chunk):  # (index mod 13) + rank, in pieces: no big temporaries
            hi = min(count, lo + chunk)
            src[lo:hi] = torch.arange(lo, hi, dtype=torch.int32).remainder_(13).add_(rank)
        x = torch.empty(count, dtype=torch.float32)

        def wrong_elements():  # the exact sum: (src - rank) * N + N(N-1)/2, checked in pieces
            bad = 0
            for lo in range(0, count, chunk):
                hi = min(count, lo + chunk)
                want = src[lo:hi].sub(rank).mul_(world).add_(world * (world - 1) / 2)
                bad += int(x[lo:hi].ne(want).sum())
            return bad
        times, wrong = [], 0
        for it in range(warm + iters):
            x.copy_(src)
            dist.barrier(group=side)
            t0 = time.perf_counter()
            dist.all_reduce(x)
            t1 = time.perf_counter()
            if it >= warm:
                times.append(t1 - t0)
                if a.c:
                    wrong = max(wrong, wrong_elements())
        times = max_over_ranks(times)
        w = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(w, group=side)
        med = statistics.median(times)
        algbw = size / med / 1e9
        if gs is not None and not transport_printed:
            try:
                st = gs.stats()
                out(f"# transport: {st.get('transport', '?')}")
            except Exception as e:  # the table is still worth having
                out(f"# transport: ? (stats() failed: {e!r})")
            transport_printed = True
        out(f"{size:12d} {count:12d}  float32    sum    -1 {med * 1e6:12.2f} {algbw:12.3f} "
            f"{algbw * busf:12.3f} {int(w) if a.c else 'N/A':>8}")
        del src, x

    if a.lat_n > 0:
        x = torch.ones(2, dtype=torch.float32)
        each = []
        for it in range(a.lat_w + a.lat_n):
            dist.barrier(group=side)
            t0 = time.perf_counter()
            dist.all_reduce(x)
            t1 = time.perf_counter()
            if it >= a.lat_w:
                each.append(t1 - t0)
        each = max_over_ranks(each)
        dist.barrier(group=side)
        t0 = time.perf_counter()
        for _ in range(a.lat_n):
            dist.all_reduce(x)
        loop = max_over_ranks([(time.perf_counter() - t0) / a.lat_n])[0]
        out(f"# latency8 med_us {statistics.median(each) * 1e6:.1f} loop_us {loop * 1e6:.1f} "
            f"n {a.lat_n} (2 x float32; med: after a barrier each, slowest rank; loop: "
            f"back to back, mean)")

    if gs is not None:
        try:
            st = gs.stats()
            out("# stats: " + " ".join(f"{k}={v}" for k, v in sorted(st.items())))
        except Exception as e:
            out(f"# stats: failed: {e!r}")
    rss = max_over_ranks([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss])[0]
    out(f"# peak_rss_kb {int(rss)}")
    dist.barrier(group=side)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
