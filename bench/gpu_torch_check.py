"""The PyTorch backend on CUDA tensors, in 2 real processes (run by bench/gpu_device_run.sh).

    PYTHONPATH=build/python python3 bench/gpu_torch_check.py [--device cuda|cpu] [--timeout S]

Without RANK in the environment it starts 2 ranks of itself (RANK, WORLD_SIZE, MASTER_ADDR=
127.0.0.1, a free MASTER_PORT), prints their output and exits 0 only when both passed. Each rank:
init_process_group("gradstream"); all_reduce SUM and AVG (float32 at 1, 1000 and 4 Mi elements,
bf16 and fp16 small), all_gather (list and tensor forms), broadcast from rank 1,
reduce_scatter_tensor, an async all_reduce, values checked exactly; gradstream.torch.stats()
must name the device path; DDP steps on a small model with DDP's own allreduce, the comm hook
raw (gradients equal to the mean of the ranks' local gradients) and int8 + error feedback,
replicas' parameters equal afterwards; destroy_process_group. Every check runs and prints
"PASS name" or "FAIL name: why" (after a failed collective the group is broken and later checks
fail too: the first FAIL is the one that counts). --device cpu runs the same on CPU tensors (to
check the script where no GPU exists); with --device cuda and no usable CUDA a rank exits 3.
"""
import argparse
import warnings
import datetime
import json
import os
import socket
import subprocess
import sys
import time
import traceback


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2")
    procs = []
    for r in range(2):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                       "--device", args.device, "--timeout", str(args.timeout)],
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    deadline = time.monotonic() + args.timeout
    outputs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n[launcher: rank killed after {args.timeout} s]"
        outputs.append(out)
        codes.append(p.returncode)
    for r, (code, out) in enumerate(zip(codes, outputs)):
        print(f"--- rank {r} (exit {code})")
        print(out.rstrip())
    ok = all(c == 0 for c in codes)
    print(f"gpu_torch_check: {'PASS' if ok else 'FAIL'} (device {args.device}, exit codes {codes})")
    return 0 if ok else 1


def rank_main(args):
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch renaming its functions
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"torch {torch.__version__}, cuda available {torch.cuda.is_available()}, "
          f"devices {torch.cuda.device_count()}", flush=True)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("FAIL setup: --device cuda but torch sees no usable CUDA device", flush=True)
            return 3
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) %
                           torch.cuda.device_count())
        torch.cuda.set_device(dev)
        print(f"rank {rank} on {torch.cuda.get_device_name(dev)}", flush=True)
    else:
        dev = torch.device("cpu")
    import gradstream.torch as gt  # registers the backend "gradstream"

    failures = []

    def check(name, fn):
        try:
            extra = fn()
            print(f"PASS {name}" + (f" {extra}" if extra else ""), flush=True)
        except Exception as e:  # keep going: one run reports everything
            failures.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=4)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def values(n, r, dtype=torch.float32):
        return ((torch.arange(n, device=dev) % 97) + 10 * r).to(dtype)

    def expect_equal(got, want, what):
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            i = int(bad[0]) if bad.numel() else -1
            raise AssertionError(f"{what}: {bad.numel()} elements differ, first at {i}: "
                                 f"got {got.reshape(-1)[i].item()} want {want.reshape(-1)[i].item()}")

    dist.init_process_group("gradstream", timeout=datetime.timedelta(seconds=60))

    def allreduce(op, n, dtype=torch.float32):
        t = values(n, rank, dtype)
        dist.all_reduce(t, op=op)
        total = sum(values(n, r, torch.float32) for r in range(world))
        want = (total if op == dist.ReduceOp.SUM else total / world).to(dtype)
        expect_equal(t, want, f"all_reduce {op} {n} x {dtype}")

    for n in (1, 1000, 4 << 20):
        check(f"all_reduce_sum_f32_{n}", lambda n=n: allreduce(dist.ReduceOp.SUM, n))
        check(f"all_reduce_avg_f32_{n}", lambda n=n: allreduce(dist.ReduceOp.AVG, n))
    check("all_reduce_sum_bf16_4096", lambda: allreduce(dist.ReduceOp.SUM, 4096, torch.bfloat16))
    check("all_reduce_sum_f16_4096", lambda: allreduce(dist.ReduceOp.SUM, 4096, torch.float16))

    def all_gather():
        n = 300001
        outs = [torch.full((n,), -1.0, device=dev) for _ in range(world)]
        dist.all_gather(outs, values(n, rank))
        for r in range(world):
            expect_equal(outs[r], values(n, r), f"all_gather list [{r}]")
        flat = torch.full((world * n,), -1.0, device=dev)
        dist.all_gather_into_tensor(flat, values(n, rank))
        expect_equal(flat, torch.cat([values(n, r) for r in range(world)]), "all_gather_into_tensor")

    def broadcast():
        t = values(123457, rank)
        dist.broadcast(t, src=1)
        expect_equal(t, values(123457, 1), "broadcast from 1")

    def reduce_scatter():
        n = 65537
        inp = torch.cat([values(n, rank) + 1000 * b for b in range(world)])
        out = torch.full((n,), -1.0, device=dev)
        dist.reduce_scatter_tensor(out, inp)
        want = sum(values(n, r) + 1000 * rank for r in range(world))
        expect_equal(out, want, "reduce_scatter_tensor")

    def async_allreduce():
        t = values(1 << 20, rank)
        work = dist.all_reduce(t, async_op=True)
        t2 = t * 1  # later work on the stream must see the result once waited for
        work.wait()
        t3 = t * 1
        sync()
        expect_equal(t3, sum(values(1 << 20, r) for r in range(world)), "async all_reduce")
        del t2

    def timing():
        t = torch.ones(16 << 20, device=dev)  # 64 MiB of float32
        dist.all_reduce(t)
        sync()
        times = []
        for _ in range(5):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            sync()
            times.append(time.perf_counter() - start)
        med = sorted(times)[2]
        return f"64 MiB all_reduce median {med * 1e3:.2f} ms, algbw {t.numel() * 4 / med / 1e9:.2f} GB/s"

    check("all_gather", all_gather)
    check("broadcast", broadcast)
    check("reduce_scatter_tensor", reduce_scatter)
    check("async_all_reduce", async_allreduce)
    check("timing", timing)

    def stats():
        s = gt.stats()
        keys = ("device_path", "staged_collectives", "staged_to_host_bytes",
                "staged_to_device_bytes", "transport")
        shown = {k: s.get(k) for k in keys if k in s}
        if dev.type == "cuda":
            if s.get("device_path") != "pinned_host_staging":
                raise AssertionError(f"device_path {s.get('device_path')!r}: {shown}")
            if not s.get("staged_collectives"):
                raise AssertionError(f"no staged collectives counted: {shown}")
        return json.dumps(shown)

    check("stats", stats)

    # -- DDP --------------------------------------------------------------------------------
    def make_model():
        torch.manual_seed(1 + rank)  # different on purpose: DDP broadcasts rank 0's parameters
        return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 10)).to(dev)

    def batch(step):
        g = torch.Generator().manual_seed(1000 * step + rank)
        return (torch.randn(16, 32, generator=g).to(dev),
                torch.randint(0, 10, (16,), generator=g).to(dev))

    def flat(ts):
        return torch.cat([t.detach().reshape(-1) for t in ts])

    def same_on_every_rank(t):
        gathered = torch.empty(world * t.numel(), dtype=t.dtype, device=dev)
        dist.all_gather_into_tensor(gathered, t.contiguous())
        return all(torch.equal(gathered[r * t.numel():(r + 1) * t.numel()], t)
                   for r in range(world))

    def ddp_steps(codec, ef, steps=3, tol=None):
        model = make_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
        if not same_on_every_rank(flat(model.parameters())):
            raise AssertionError("DDP's initial broadcast left the replicas different")
        state = None
        if codec is not None:
            state = gt.GradstreamState(codec=codec, error_feedback=ef)
            ddp.register_comm_hook(state, gt.comm_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        worst = 0.0
        for step in range(steps):
            x, y = batch(step)
            # The reference: this rank's local gradient, averaged over the ranks by all_reduce.
            local = [torch.autograd.grad(
                torch.nn.functional.cross_entropy(model(x), y), list(model.parameters()))]
            ref = flat(local[0])
            dist.all_reduce(ref, op=dist.ReduceOp.AVG)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            got = flat(p.grad for p in model.parameters())
            if not same_on_every_rank(got):
                raise AssertionError(f"step {step}: averaged gradients differ between ranks")
            err = float((got - ref).norm() / ref.norm())
            worst = max(worst, err)
            if tol is not None and err > tol:
                raise AssertionError(f"step {step}: gradient rel. error {err:.3g} > {tol}")
            opt.step()
        sync()
        params = flat(model.parameters())
        if not same_on_every_rank(params):
            raise AssertionError("replicas' parameters differ after the steps")
        buckets = len(state._streams) if state is not None else "-"
        if state is not None:
            state.close()
        return (f"{steps} steps, {params.numel()} params, buckets {buckets}, "
                f"max gradient rel. error vs mean of local grads {worst:.3g}")

    check("ddp_builtin_allreduce", lambda: ddp_steps(None, False, tol=1e-5))
    check("ddp_hook_raw", lambda: ddp_steps("raw", False, tol=1e-5))
    check("ddp_hook_int8_ef", lambda: ddp_steps("int8", True, tol=5e-2))

    dist.destroy_process_group()
    print(f"rank {rank}: {'all checks passed' if not failures else 'FAILED: ' + ', '.join(failures)}",
          flush=True)
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--timeout", type=float, default=150.0)
    args = p.parse_args()
    if "RANK" not in os.environ:
        return launch(args)
    try:
        return rank_main(args)
    except Exception:
        traceback.print_exc()
        return 2


if __name__ == "__main__":
    sys.exit(main())
