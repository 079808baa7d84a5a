#!/usr/bin/env python3
"""DDP training with gradstream: the same run (seed, data shards, model init) over several backends.

Trains a small MLP on scikit-learn's digits data set (8x8 images, 10 classes; shipped inside
the scikit-learn package, nothing is downloaded) with torch DistributedDataParallel on CPU, once
per variant:

  gloo      torch's gloo backend, plain DDP (the reference)
  raw       backend "gradstream", plain DDP allreduce (no comm hook)
  bf16      backend "gradstream", comm hook, bf16 on the wire, no error feedback
  int8_ef   backend "gradstream", comm hook, int8 + error feedback
  int4_ef   backend "gradstream", comm hook, int4 + error feedback

Any other codec works too: "<codec>" is the hook without error feedback, "<codec>_ef" with it
(codecs: raw, bf16, fp16, fp8e4m3, fp8e5m2, int8, int4, auto).

Each variant is its own set of --world-size processes (torch.multiprocessing spawn, rendezvous
on 127.0.0.1 at a free port) with its own process group lifetime. Rank 0 records the training
loss averaged over ranks at every step and the wire bytes of every step (gradstream: the
difference of the hook communicator's stats()["bytes_wire"] across backward(), which is
gradstream.torch.stats() except for codec "auto", whose state has a communicator of its own;
gloo: numel * 4 of all gradients, the logical size, as the reference) and writes a JSON file.
After training every rank hashes its parameters and the hashes are compared across ranks
(all_gather_object).

The parent prints a table, checks that every variant's final loss (mean training loss over the
last 10 % of the steps) is within --tolerance (relative, default 2 %) of gloo's and that
parameters are bit-identical across ranks, and exits 1 naming the variant otherwise. --plot
writes a PNG with the loss curves (and their distance from gloo) and the wire bytes per step.

    python3 examples/ddp_train.py --plot docs/images/ddp_loss.png

The gradstream package is found on PYTHONPATH or, failing that, in build/python of this
repository. If it cannot be imported the gradstream variants are skipped with a message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import secrets
import socket
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODECS = ("raw", "bf16", "fp16", "fp8e4m3", "fp8e5m2", "int8", "int4", "auto")
DEFAULT_VARIANTS = "gloo,raw,bf16,int8_ef,int4_ef"
MiB = 1024.0 * 1024.0


# --------------------------------------------------------------------------------------------
# variants


def parse_variant(name: str) -> dict:
    """gloo | raw | <codec> | <codec>_ef  ->  {backend, codec (hook) or None, error_feedback}."""
    if name == "gloo":
        return {"name": name, "backend": "gloo", "codec": None, "error_feedback": False}
    if name == "raw":
        return {"name": name, "backend": "gradstream", "codec": None, "error_feedback": False}
    codec, ef = (name[:-3], True) if name.endswith("_ef") else (name, False)
    if codec not in CODECS:
        raise ValueError(f"unknown variant {name!r}: expected gloo, raw, <codec> or <codec>_ef "
                         f"with codec in {', '.join(CODECS)}")
    return {"name": name, "backend": "gradstream", "codec": codec, "error_feedback": ef}


def describe(v: dict) -> str:
    if v["backend"] == "gloo":
        return "gloo, no hook"
    if v["codec"] is None:
        return "gradstream, no hook"
    return f"gradstream hook {v['codec']}" + (" + EF" if v["error_feedback"] else "")


def import_gradstream():
    """Imports gradstream.torch (PYTHONPATH, then <repo>/build/python). Returns (module, error)."""
    try:
        import gradstream.torch as gt  # noqa: F401
        return gt, None
    except ImportError as first:
        build = os.path.join(REPO, "build", "python")
        if os.path.isdir(build) and build not in sys.path:
            sys.path.insert(0, build)
            for mod in [m for m in sys.modules if m == "gradstream" or m.startswith("gradstream.")]:
                del sys.modules[mod]
            try:
                import gradstream.torch as gt  # noqa: F401
                return gt, None
            except ImportError as second:
                return None, f"{first}; with {build}: {second}"
        return None, str(first)


# --------------------------------------------------------------------------------------------
# data and model (identical on every rank and in every variant)


def load_data(seed: int):
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    n_test = len(y) // 5
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def make_model(seed: int, hidden: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def shard_batches(n_train: int, batch: int, rank: int, world: int, seed: int):
    """Yields this rank's index tensor for every step: each epoch one permutation (seeded by
    seed and epoch, the same on every rank and variant), global batches of batch*world, rank r
    takes positions r, r+world, ... of each global batch."""
    import torch

    g = torch.Generator()
    global_batch = batch * world
    per_epoch = n_train // global_batch
    epoch = 0
    while True:
        g.manual_seed(seed * 1000003 + epoch)
        perm = torch.randperm(n_train, generator=g)
        for i in range(per_epoch):
            yield perm[i * global_batch:(i + 1) * global_batch][rank::world]
        epoch += 1


# --------------------------------------------------------------------------------------------
# worker


def worker(rank: int, variant: dict, cfg: dict, port: int, result_dir: str) -> None:
    """One rank of a variant; leaves the process without interpreter finalization.

    torch's gloo backend completes work on its own C++ threads, which drop the last reference
    to a work's tensors after the Python call returned. When that drop comes after the
    interpreter started finalizing, the thread's GIL acquire ends it with pthread_exit and the
    process aborts ("terminate called without an active exception"; seen here about once in
    30 gloo runs, the trace in ~AsyncAllgatherWork). The results are on disk and the process
    group is destroyed by then, so the worker exits at once, with the status of its run.
    """
    try:
        train_rank(rank, variant, cfg, port, result_dir)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train_rank(rank: int, variant: dict, cfg: dict, port: int, result_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    world = cfg["world_size"]
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})

    gt = None
    if variant["backend"] == "gradstream":
        gt, err = import_gradstream()
        if gt is None:
            raise RuntimeError(f"cannot import gradstream.torch: {err}")
    dist.init_process_group(variant["backend"])
    try:
        x_train, y_train, x_test, y_test = load_data(cfg["seed"])
        model = make_model(cfg["seed"], cfg["hidden"])
        ddp = DDP(model)
        state = None
        if variant["codec"] is not None:
            state = gt.GradstreamState(codec=variant["codec"],
                                       error_feedback=variant["error_feedback"])
            ddp.register_comm_hook(state, gt.comm_hook)
            # The hook's communicator: the group's, or for codec "auto" one of the state's own
            # (made collectively here, on every rank at the same point, rather than in the first
            # hook call) whose bytes gradstream.torch.stats(group) would not show.
            state.communicator()
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        logical_step = sum(p.numel() * p.element_size() for p in model.parameters())

        def counters():
            """(bytes_wire, bytes_logical) so far on the communicator carrying the gradients."""
            if gt is None:
                return 0, 0
            st = state.stats() if state is not None else gt.stats()
            return int(st["bytes_wire"]), int(st["bytes_logical"])

        losses, wire, logical = [], [], []
        batches = shard_batches(len(y_train), cfg["batch"], rank, world, cfg["seed"])
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(cfg["steps"]):
            idx = next(batches)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x_train[idx]), y_train[idx])
            w0, l0 = counters()
            loss.backward()  # DDP's allreduce (or the comm hook) completes inside backward()
            w1, l1 = counters()
            opt.step()
            losses.append(loss.item())
            wire.append(w1 - w0 if gt is not None else logical_step)
            logical.append(l1 - l0 if gt is not None else logical_step)
        elapsed = time.perf_counter() - t0

        # loss averaged over ranks: one allreduce of the whole curve, after the timed loop
        curve = torch.tensor(losses, dtype=torch.float64)
        dist.all_reduce(curve)
        curve /= world

        with torch.no_grad():
            out = model(x_test)
            test_loss = loss_fn(out, y_test).item()
            test_acc = (out.argmax(1) == y_test).float().mean().item()

        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
        hashes = [None] * world
        dist.all_gather_object(hashes, digest)

        stats = None
        if gt is not None:
            st = state.stats() if state is not None else gt.stats()
            stats = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                     for k, v in st.items()}

        if rank == 0:
            result = {
                "variant": variant["name"], "description": describe(variant),
                "backend": variant["backend"], "codec": variant["codec"],
                "error_feedback": variant["error_feedback"], "world_size": world,
                "steps": cfg["steps"], "seconds": elapsed, "steps_per_s": cfg["steps"] / elapsed,
                "loss": curve.tolist(), "wire_bytes": wire, "logical_bytes": logical,
                "grad_bytes_per_step": logical_step,
                "test_loss": test_loss, "test_accuracy": test_acc,
                "param_hashes": hashes, "params_identical": len(set(hashes)) == 1,
                "stats": stats,
            }
            tmp = os.path.join(result_dir, variant["name"] + ".json.tmp")
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, os.path.join(result_dir, variant["name"] + ".json"))
        if state is not None:
            state.close()  # the hook's streams (and codec "auto"'s own communicator)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_variant(variant: dict, cfg: dict, result_dir: str, timeout_s: float) -> dict:
    import torch.multiprocessing as mp

    if variant["backend"] == "gradstream" and "GS_SECRET" not in os.environ:
        os.environ["GS_SECRET"] = secrets.token_hex(16)  # inherited by the spawned workers
    port = free_port()
    ctx = mp.spawn(worker, args=(variant, cfg, port, result_dir), nprocs=cfg["world_size"],
                   join=False)
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(5)
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"variant {variant['name']}: no result within {timeout_s:.0f} s")
    with open(os.path.join(result_dir, variant["name"] + ".json")) as f:
        return json.load(f)


def final_loss(curve: list, steps: int) -> float:
    window = max(1, steps // 10)
    tail = curve[-window:]
    return sum(tail) / len(tail)


def moving_average(curve: list, window: int) -> list:
    out, acc = [], 0.0
    for j, v in enumerate(curve):
        acc += v
        if j >= window:
            acc -= curve[j - window]
        out.append(acc / min(j + 1, window))
    return out


def plot(results: dict, path: str, cfg: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    have_ref = "gloo" in results and len(names) > 1
    fig = plt.figure(figsize=(13, 5.6))
    grid = fig.add_gridspec(2, 2, width_ratios=[3, 2], height_ratios=[3, 1] if have_ref else [1, 0])
    ax1 = fig.add_subplot(grid[0, 0] if have_ref else grid[:, 0])
    ax2 = fig.add_subplot(grid[:, 1])
    window = max(1, cfg["steps"] // 50)
    smooth = {n: moving_average(results[n]["loss"], window) for n in names}
    steps = range(1, cfg["steps"] + 1)
    for i, n in enumerate(names):
        r = results[n]
        rel = (f", {r['rel_diff_vs_gloo']:.2%} off gloo"
               if r["rel_diff_vs_gloo"] is not None and n != "gloo" else "")
        style = "-" if i == 0 else (0, (4, 1.5 + 0.5 * i))
        ax1.plot(steps, smooth[n], linestyle=style, linewidth=1.6, color=colors[n],
                 label=f"{n}: final {r['final_loss']:.5f}{rel}")
    ax1.set_yscale("log")
    if not have_ref:
        ax1.set_xlabel("step")
    ax1.set_ylabel(f"training loss (mean over ranks,\n{window}-step moving average)")
    ax1.set_title(f"digits MLP under DDP: {cfg['world_size']} ranks, {cfg['steps']} steps, "
                  f"seed {cfg['seed']}")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(loc="upper right", fontsize=9)
    if have_ref:
        # The curves lie on top of each other: a strip below shows each one's distance from gloo.
        ax3 = fig.add_subplot(grid[1, 0], sharex=ax1)
        ax1.tick_params(labelbottom=False)
        ref = smooth["gloo"]
        for n in names:
            if n != "gloo":
                ax3.plot(steps, [100.0 * (a - b) / b for a, b in zip(smooth[n], ref)],
                         color=colors[n], linewidth=1)
        ax3.axhline(0, color=colors["gloo"], linewidth=1)
        ax3.set_ylabel("vs gloo, %", fontsize=9)
        ax3.set_xlabel("step")
        ax3.tick_params(labelsize=8)
        ax3.grid(True, alpha=0.3)

    mib = [results[n]["wire_mib_per_step"] for n in names]
    bars = ax2.bar(names, mib, color=[colors[n] for n in names])
    ref_mib = results[names[0]]["grad_bytes_per_step"] / MiB
    ax2.axhline(ref_mib, color="gray", linestyle=":", linewidth=1,
                label=f"fp32 gradients (numel x 4 = {ref_mib:.3f} MiB)")
    for b, n in zip(bars, names):
        r = results[n]
        label = f"{b.get_height():.3f}"
        if r["backend"] == "gloo":
            label += "\n(numel x 4)"
        elif r["compression_ratio"]:
            label += f"\n{r['compression_ratio']:.2f}x"
        ax2.text(b.get_x() + b.get_width() / 2, b.get_height(), label, ha="center",
                 va="bottom", fontsize=8)
    ax2.set_ylabel("MiB per step")
    ax2.set_title("gradient bytes rank 0 put on the wire per step")
    ax2.set_ylim(0, max(mib + [ref_mib]) * 1.3)
    ax2.legend(loc="upper right", fontsize=8)
    ax2.tick_params(axis="x", labelsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2, help="processes per variant (2-4)")
    ap.add_argument("--steps", type=int, default=400, help="optimizer steps per variant")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help=f"comma list; gloo first is the reference (default {DEFAULT_VARIANTS})")
    ap.add_argument("--tolerance", type=float, default=0.02,
                    help="allowed |final - gloo final| / gloo final (default 0.02; measured: "
                         "<0.1%% at 400 steps, <0.4%% at 1500, seed-to-seed spread ~8%%)")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG of loss curves and wire bytes")
    ap.add_argument("--out", metavar="PATH", help="write all results as JSON")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--hidden", type=int, default=512, help="hidden width of the MLP")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per variant")
    ap.add_argument("--require-gradstream", action="store_true",
                    help="fail instead of skipping the gradstream variants when the package "
                         "cannot be imported (the test suite runs it so)")
    args = ap.parse_args()

    if not 1 <= args.world_size <= 16:
        ap.error("--world-size must be between 1 and 16 (2-4 is what this example is for)")
    if args.steps < 1:
        ap.error("--steps must be positive")
    try:
        variants = [parse_variant(v.strip()) for v in args.variants.split(",") if v.strip()]
    except ValueError as e:
        ap.error(str(e))
    if not variants:
        ap.error("--variants is empty")
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        ap.error("--variants names a variant twice")
    if "gloo" in names:  # the reference goes first
        variants.sort(key=lambda v: v["name"] != "gloo")

    cfg = {"world_size": args.world_size, "steps": args.steps, "seed": args.seed,
           "batch": args.batch, "hidden": args.hidden, "lr": args.lr}

    skipped = {}
    if any(v["backend"] == "gradstream" for v in variants):
        gt, err = import_gradstream()
        if gt is None and args.require_gradstream:
            sys.exit(f"error: gradstream.torch cannot be imported ({err})")
        if gt is None:
            print(f"warning: gradstream.torch cannot be imported ({err}); "
                  f"skipping the gradstream variants", file=sys.stderr)
            for v in variants:
                if v["backend"] == "gradstream":
                    skipped[v["name"]] = f"gradstream.torch not importable: {err}"
            variants = [v for v in variants if v["backend"] != "gradstream"]

    import torch.multiprocessing as mp

    results, failures = {}, []
    with tempfile.TemporaryDirectory(prefix="ddp_train.") as tmp:
        for v in variants:
            print(f"[{v['name']}] {describe(v)}, {args.world_size} ranks, {args.steps} steps ...",
                  flush=True)
            t0 = time.monotonic()
            try:
                r = run_variant(v, cfg, tmp, args.timeout)
            except Exception as e:  # noqa: BLE001 - report and go on with the other variants
                msg = str(e).strip().splitlines()
                failures.append(f"variant {v['name']} failed: "
                                f"{msg[-1] if msg else type(e).__name__}")
                print(f"[{v['name']}] FAILED after {time.monotonic() - t0:.1f} s:\n{e}",
                      file=sys.stderr, flush=True)
                if not isinstance(e, (TimeoutError, mp.ProcessRaisedException,
                                      mp.ProcessExitedException)):
                    traceback.print_exc()
                continue
            r["final_loss"] = final_loss(r["loss"], args.steps)
            r["wire_mib_per_step"] = sum(r["wire_bytes"]) / len(r["wire_bytes"]) / MiB
            r["compression_ratio"] = (sum(r["logical_bytes"]) / sum(r["wire_bytes"])
                                      if r["backend"] == "gradstream" and sum(r["wire_bytes"])
                                      else None)
            r["wall_s"] = time.monotonic() - t0
            results[v["name"]] = r
            print(f"[{v['name']}] done in {r['wall_s']:.1f} s", flush=True)

    ref = results.get("gloo")
    for r in results.values():
        r["rel_diff_vs_gloo"] = (abs(r["final_loss"] - ref["final_loss"]) / ref["final_loss"]
                                 if ref else None)
        r["params_identical_to_gloo"] = (r["param_hashes"][0] == ref["param_hashes"][0]
                                         if ref else None)

    # table
    hdr = (f"{'variant':<9} {'path':<27} {'final loss':>10} {'|d|/gloo':>9} {'wire MiB/step':>13} "
           f"{'ratio':>6} {'steps/s':>8} {'test acc':>8} {'ranks equal':>11}")
    print()
    print(f"final loss = mean training loss (over ranks) of the last {max(1, args.steps // 10)} "
          f"of {args.steps} steps; world size {args.world_size}; tolerance "
          f"{args.tolerance:.2%} relative to gloo")
    print(hdr)
    print("-" * len(hdr))
    for n, r in results.items():
        rel = f"{r['rel_diff_vs_gloo']:.2%}" if r["rel_diff_vs_gloo"] is not None else "n/a"
        ratio = f"{r['compression_ratio']:.2f}" if r["compression_ratio"] else "-"
        wire = f"{r['wire_mib_per_step']:.4f}" + ("*" if r["backend"] == "gloo" else " ")
        print(f"{n:<9} {r['description']:<27} {r['final_loss']:>10.5f} {rel:>9} {wire:>13} "
              f"{ratio:>6} {r['steps_per_s']:>8.1f} {r['test_accuracy']:>8.3f} "
              f"{'yes' if r['params_identical'] else 'NO':>11}")
    for n, why in skipped.items():
        print(f"{n:<9} skipped: {why}")
    print("wire: gradstream: stats()['bytes_wire'] sent by rank 0 per step (a ring sends "
          "2(N-1)/N of the buffer); *gloo: numel * 4 of the\ngradients, the reference; ratio: "
          "bytes_logical / bytes_wire of the gradient traffic")
    if "gloo" in results:
        same = [n for n, r in results.items() if n != "gloo" and r["params_identical_to_gloo"]]
        if same:
            print(f"parameters bit-identical to gloo's after training: {', '.join(same)}")

    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"config": cfg, "tolerance": args.tolerance, "results": results,
                       "skipped": skipped, "failures": failures}, f, indent=1)
        print(f"wrote {args.out}")
    if args.plot and results:
        plot(results, args.plot, cfg)
        print(f"wrote {args.plot}")

    # checks
    for n, r in results.items():
        if not r["params_identical"]:
            failures.append(f"variant {n}: parameters differ between ranks after training "
                            f"(sha256 per rank: {', '.join(h[:12] for h in r['param_hashes'])})")
        if not math.isfinite(r["final_loss"]):
            failures.append(f"variant {n}: final loss is {r['final_loss']}")
        elif ref is not None and r["rel_diff_vs_gloo"] > args.tolerance:
            failures.append(f"variant {n}: final loss {r['final_loss']:.5f} differs from gloo's "
                            f"{ref['final_loss']:.5f} by {r['rel_diff_vs_gloo']:.2%} "
                            f"> tolerance {args.tolerance:.2%}")
    if ref is None and results:
        print("note: gloo is not among the variants; no loss comparison", file=sys.stderr)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("\nOK: every variant within tolerance of gloo, parameters bit-identical across ranks"
          + (f" (skipped: {', '.join(skipped)})" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
