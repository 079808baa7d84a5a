#!/usr/bin/env python3
"""DDP training steps of an MLP (about 25 M parameters), one process per rank.

Started by bench/torch_ddp_shaped.sh (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set);
rank 0 prints per-step lines and one "# result" line of key=value pairs.

  torch_ddp_step.py --backend gloo|gradstream [--hook-codec none|raw|bf16|int8|int4|auto]
                    [--ef 0|1] [--steps 10] [--warmup 3] [--batch 16] [--width 4096]

Model: Linear(in, width) ReLU, (layers - 2) x [Linear(width, width) ReLU], Linear(width, in):
with the defaults 1024 -> 4096 -> 4096 -> 1024, 25.2 M parameters (101 MB of float32
gradients per step). Task: regression on a fixed random teacher y = tanh(x T), MSE, SGD with
momentum. Every rank starts from the same weights (seed; DDP broadcasts rank 0's anyway) and
trains on its own batches (seed + rank), pre-generated so the timed steps hold no data work.
The loss reported (loss0 before the first step, loss after the last) is rank 0's replica's MSE
on every rank's training batches together, so runs of different variants with the same seed
compare directly (each batch is seen once, so the drop is a few per cent). Being first order in
the gradient, the loss hardly sees unbiased codec noise; --save-update keeps a sample of the
parameters' change, which torch_ddp_shaped.sh compares between variants.

Bookkeeping (barriers, max over ranks, the replica check) runs on a separate Gloo group.
"""
import argparse
import datetime
import statistics
import sys
import time

from torch_job import Job


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", required=True, choices=["gloo", "gradstream"])
    ap.add_argument("--hook-codec", default="none",
                    help="gradstream comm hook codec; none: DDP's own allreduce")
    ap.add_argument("--ef", type=int, default=1, choices=[0, 1], help="hook error feedback")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--in-dim", type=int, default=1024)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=3, help="Linear layers (>= 2)")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--timeout", type=float, default=300, help="process group timeout, s")
    ap.add_argument("--tag", default="", help="name printed in the result line")
    ap.add_argument("--save-update", default="",
                    help="rank 0 saves every 97th element of its parameters' change here")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(a.threads)
    gs = None
    if a.backend == "gradstream":
        import gradstream.torch as gs  # registers the backend
    if a.hook_codec != "none" and gs is None:
        ap.error("--hook-codec needs --backend gradstream")
    job = Job(a.backend, a.timeout)
    rank, world, side, t_init = job.rank, job.world, job.side, job.init_seconds
    out, max_over_ranks = job.out, job.max_over_ranks

    torch.manual_seed(a.seed)
    dims = [a.in_dim] + [a.width] * (a.layers - 1) + [a.in_dim]
    mods = []
    for i in range(len(dims) - 1):
        mods.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            mods.append(nn.ReLU())
    model = nn.Sequential(*mods)
    nparams = sum(p.numel() for p in model.parameters())
    teacher = torch.randn(a.in_dim, a.in_dim) / a.in_dim ** 0.5

    def rank_batches(r):
        g = torch.Generator().manual_seed(a.seed + 1 + r)
        xs = [torch.randn(a.batch, a.in_dim, generator=g) for _ in range(a.warmup + a.steps)]
        return [(x, torch.tanh(x @ teacher)) for x in xs]

    batches = rank_batches(rank)
    # Evaluation set: every rank's training batches (regenerated from their seeds).
    x_eval = torch.cat([x for r in range(world) for x, _ in rank_batches(r)])
    y_eval = torch.tanh(x_eval @ teacher)
    loss_fn = nn.MSELoss()

    # Compute alone (forward + backward, no communication, no update) for reference.
    comp = []
    for i in range(3):
        x, y = batches[i]
        t0 = time.perf_counter()
        loss_fn(model(x), y).backward()
        comp.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    compute_ms = statistics.median(max_over_ranks(comp)) * 1e3

    def sample():  # every 97th parameter element, for --save-update
        return torch.cat([p.detach().reshape(-1)[::97] for p in model.parameters()]).clone()

    with torch.no_grad():
        loss0 = float(loss_fn(model(x_eval), y_eval))
    p_start = sample()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    hook = "none"
    if a.hook_codec != "none":
        state = gs.GradstreamState(codec=a.hook_codec, error_feedback=bool(a.ef))
        ddp.register_comm_hook(state, gs.comm_hook)
        hook = f"{a.hook_codec}{'+ef' if a.ef else ''}"
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    out(f"# torch_ddp_step.py backend={a.backend} hook={hook} N={world} params={nparams} "
        f"({nparams * 4 / 1e6:.1f} MB float32) batch={a.batch} dims={dims} threads={a.threads} "
        f"bucket_cap_mb={a.bucket_mb} init {t_init:.2f} s; torch {torch.__version__}")

    def step(i):
        x, y = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    def figures():
        if gs is None:
            return {}
        try:  # the hook's communicator (its own for codec "auto"), else the group's
            return state.stats() if a.hook_codec != "none" else gs.stats()
        except Exception as e:
            return {"error": repr(e)}

    st0 = figures()  # after DDP's initial broadcast of the parameters
    for i in range(a.warmup):
        step(i)
    dist.barrier(group=side)
    times, losses = [], []
    t_start = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        t0 = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_start
    total = max_over_ranks([total])[0]
    times = max_over_ranks(times)
    for i, (t, l) in enumerate(zip(times, losses)):
        out(f"# step {a.warmup + i:3d} {t * 1e3:9.1f} ms  train loss (rank 0 batch) {l:.6f}")

    with torch.no_grad():
        loss = float(loss_fn(ddp.module(x_eval), y_eval))
        # Replica check: a few checksums of the parameters, spread over ranks.
        sums = torch.tensor([p.double().sum() for p in ddp.module.parameters()], dtype=torch.float64)
    if a.save_update and rank == 0:
        torch.save(sample() - p_start, a.save_update)
    lo = sums.clone()
    hi = sums.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=side)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=side)
    spread = float((hi - lo).abs().max())

    wire = "-"
    if gs is not None:
        st = figures()
        out("# stats: " + " ".join(f"{k}={v}" for k, v in sorted(st.items())))
        try:  # bytes of the training steps alone (not the initial broadcast)
            dl = st["bytes_logical"] - st0.get("bytes_logical", 0)
            dw = st["bytes_wire"] - st0.get("bytes_wire", 0)
            wire = f"{dl / dw:.2f}" if dw > 0 else "-"
        except (KeyError, TypeError):
            pass
    out(f"# result tag={a.tag or a.backend} backend={a.backend} hook={hook} steps={a.steps} "
        f"steps_per_s={a.steps / total:.4f} step_med_ms={statistics.median(times) * 1e3:.1f} "
        f"compute_ms={compute_ms:.1f} loss0={loss0:.9g} loss={loss:.9g} "
        f"replica_spread={spread:.3g} wire_ratio={wire} params={nparams}")
    dist.barrier(group=side)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
