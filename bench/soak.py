#!/usr/bin/env python3
"""Soak driver for bench/soak.sh: random collectives on N ranks, every result checked.

Three roles (bench/soak.sh starts them; see bench/README.md "Soak"):

  soak.py rank --rank R --ranks N --seed S --duration SECONDS --dir DIR
      one rank. Iteration i draws its collectives from (seed, i) alone and communicator e its
      options from (seed, e) alone, so every rank issues the same calls in the same order and a
      failure names what reproduces it (--replay E:I0:I1). Rank 0 alone looks at the clock and
      tells the others, over the communicator, when to start a new communicator or stop; it
      hands each communicator's unique id to the others in a file in DIR.
  soak.py monitor --dir DIR --ranks N --interval 10
      samples VmRSS, open fds, threads and /dev/shm segments of every rank from /proc into
      DIR/samples.csv until SIGTERM.
  soak.py report --dir DIR --ranks N --duration SECONDS
      the table, the figures and the verdict (exit 1 on failure).

Only numpy and the gradstream package (its ctypes layer) are used.
"""
import argparse
import csv
import ctypes
import faulthandler
import gc
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time

import numpy as np

MiB = 1 << 20
MAX_BYTES = 64 * MiB  # the largest buffer one collective touches (send or receive side)
PERIOD = 65537  # contributions repeat with this prime period (see fill()): cheap to fill and check
CONTROL_EVERY = 8  # iterations between rank 0's continue / new communicator / stop broadcasts
UID_BYTES = 128

# dtype name -> (element size, numpy storage type, is float). bfloat16 is stored as its bits.
DTYPES = {
    "float32": (4, np.float32, True),
    "float16": (2, np.float16, True),
    "bfloat16": (2, np.uint16, True),
    "float64": (8, np.float64, True),
    "int32": (4, np.int32, False),
    "int64": (8, np.int64, False),
    "uint8": (1, np.uint8, False),
}
OPS = ["sum", "avg", "min", "max", "prod"]
KINDS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "stream"]
KIND_WEIGHTS = [0.40, 0.16, 0.16, 0.16, 0.12]

# Codecs a communicator may get, with weights (raw, the default, most often), and the relative
# L2 error a float result may show under each: ||result - exact|| / ||scale||, scale being each
# element's sum of |contributions| for sum and avg (the codec rounds the partial sums, which
# cancellation can make much larger than the result) and |exact| otherwise. The bounds are
# 2.5-5x the largest this soak measured on its own data with GS_CODEC set to each codec
# (bench/README.md "Soak"); top-k's only says "not far worse than dropping everything", and
# auto's is its floor's (int4).
CODECS = [("raw", 0.30), ("fp16", 0.06), ("bf16", 0.08), ("bf16,sr", 0.03), ("fp8e4m3", 0.06),
          ("fp8e5m2", 0.05), ("int8", 0.08), ("int8,sr", 0.04), ("int4", 0.06),
          ("int4,block=64", 0.04), ("topk:0.25", 0.04), ("auto", 0.16)]
TOLERANCE = {"raw": 0.0, "fp16": 1e-3, "bf16": 1.5e-2, "fp8e4m3": 0.1, "fp8e5m2": 0.2,
             "int8": 0.05, "int4": 0.75, "topk": 1.5, "auto": 0.75}
# A product's error compounds: every hop re-encodes a product of decoded (rounded) factors.
# Measured: int4 0.57 and int8 0.03 on float64 prod allreduces, 2x the other ops' worst.
PROD_FACTOR = 2.0
ALGOS = ["auto", "ring", "tree", "halving_doubling", "hierarchical"]

T0 = time.time()


def log(*args):
    print(f"[{time.time() - T0:7.1f}s]", *args, file=sys.stderr, flush=True)


def codec_family(codec):
    """'int4,block=64' -> 'int4', 'topk:0.25' -> 'topk'."""
    return codec.split(",")[0].split(":")[0]


# ---------------------------------------------------------------------------------------------
# What each communicator and each iteration does: functions of the seed alone.

def rng_for(seed, *path):
    return np.random.default_rng([seed, *path])


def comm_options(seed, epoch, nranks):
    """The options of communicator `epoch` (the first is 0) and how long rank 0 keeps it."""
    rng = rng_for(seed, 1, epoch)
    names = [c for c, _ in CODECS]
    weights = np.array([w for _, w in CODECS])
    opts = {
        "transport": "tcp",  # loopback: 127.0.0.1 (GS_SOCKET_IFNAME is unset by soak.sh)
        "shm": int(rng.random() < 0.6),  # 1: shared memory between these ranks, 0: tcp only
        "codec": names[rng.choice(len(names), p=weights / weights.sum())],
        "algo": ALGOS[rng.integers(len(ALGOS))],
        "sockets_per_peer": int(rng.choice([1, 2, 4])),
        "chunk_bytes": int(rng.choice([256 << 10, 1 << 20])),
        "timeout_ms": 60000,
    }
    # Two "hosts" of N/2 ranks (GS_HOSTNAME's grouping): shm inside each, tcp between them, and
    # a real two-level schedule for hierarchical.
    hosts = 2 if nranks % 2 == 0 and nranks >= 4 and rng.random() < 0.3 else 1
    lifetime = float(rng.uniform(5, 15))  # about one between-communicators sample per 10 s
    return opts, hosts, lifetime


def log_uniform_bytes(rng, lo_exp, hi_exp):
    return int(2 ** rng.uniform(lo_exp, hi_exp))


def draw_size(rng, big_ok):
    """Buffer bytes, 1 B..64 MiB, log-uniform within bands weighted toward small and mid sizes
    (a 64 MiB collective with its fill and check takes seconds on 2 cores)."""
    u = rng.random()
    if u < 0.55:
        return log_uniform_bytes(rng, 0, 16)  # 1 B .. 64 KiB (latency-bound, exchange paths)
    if u < 0.90 or not big_ok:
        return log_uniform_bytes(rng, 16, 22)  # 64 KiB .. 4 MiB (many chunks)
    return min(MAX_BYTES, log_uniform_bytes(rng, 22, 26.0001))  # 4 .. 64 MiB


def draw_op(rng, nranks, blocking_only):
    kinds = KINDS if blocking_only else KINDS[:4]
    weights = np.array(KIND_WEIGHTS[:len(kinds)])
    kind = kinds[rng.choice(len(kinds), p=weights / weights.sum())]
    dtype = list(DTYPES)[rng.integers(len(DTYPES))]
    esize = DTYPES[dtype][0]
    nbytes = draw_size(rng, big_ok=blocking_only)
    if rng.random() < 0.01:
        nbytes = 0  # count 0: a no-op that still checks its arguments
    spec = {
        "kind": kind,
        "dtype": dtype,
        "op": OPS[rng.integers(len(OPS))] if kind in ("allreduce", "reduce_scatter", "stream")
        else None,
        "inplace": bool(rng.random() < 0.3),
        # Offsets in elements from an aligned start: the library must not assume alignment
        # beyond the element's.
        "misalign": int(rng.integers(0, 8)) if rng.random() < 0.3 else 0,
        "check_send": bool(rng.random() < 0.25),  # out of place: the send buffer is untouched
        "wrap": bool(rng.random() < 0.2),  # integer sum/prod over the full range (they wrap)
    }
    if kind in ("reduce_scatter", "allgather"):
        per_rank = nbytes // (esize * nranks)
        if nbytes > 0 and per_rank == 0:
            per_rank = 1
        spec["count"] = per_rank  # recvcount / sendcount
    else:
        spec["count"] = 0 if nbytes == 0 else max(1, nbytes // esize)
    if kind == "broadcast":
        spec["root"] = int(rng.integers(nranks))
    if kind == "stream":
        spec["inplace"] = True
        spec["stream_codec"] = [None, None, "raw", "bf16", "int8", "int4"][rng.integers(6)]
        spec["error_feedback"] = bool(DTYPES[dtype][2] and rng.random() < 0.5)
        spec["bucket_bytes"] = [None, 64 << 10, 1 << 20][rng.integers(3)]
        spec["iterations"] = int(rng.integers(1, 4))
    return spec


def draw_iteration(seed, it, nranks):
    """The collectives of iteration `it`: one blocking call, or a batch of non-blocking ones
    (optionally ended by a blocking call, which must wait for them) waited for together."""
    rng = rng_for(seed, 2, it)
    if rng.random() < 0.5:
        return {"mode": "blocking", "ops": [draw_op(rng, nranks, True)]}
    n = int(rng.integers(2, 7))
    ops = [draw_op(rng, nranks, False) for _ in range(n)]
    end_blocking = bool(rng.random() < 0.3)
    return {"mode": "batch", "ops": ops, "end_blocking": end_blocking}


def buffer_elems(spec, nranks):
    """(send elements, recv elements) of an out-of-place call."""
    kind, c = spec["kind"], spec["count"]
    if kind == "reduce_scatter":
        return nranks * c, c
    if kind == "allgather":
        return c, nranks * c
    return c, c


def payload_bytes(spec, nranks):
    s, r = buffer_elems(spec, nranks)
    return max(s, r) * DTYPES[spec["dtype"]][0]


def fit_batch(ops, nranks):
    """Keeps a batch within the arenas: drops ops from the end past MAX_BYTES on either side."""
    total_s = total_r = 0
    kept = []
    for spec in ops:
        s, r = buffer_elems(spec, nranks)
        es = DTYPES[spec["dtype"]][0]
        s_b, r_b = (s + 8) * es + 64, (r + 8) * es + 64
        if kept and (total_s + s_b > MAX_BYTES or total_r + r_b > MAX_BYTES):
            break
        total_s += s_b
        total_r += r_b
        kept.append(spec)
    return kept


# ---------------------------------------------------------------------------------------------
# Contributions and their exact reduction.

def contribution(seed, it, j, r, spec, n, lossy):
    """Rank r's values for op j of iteration it: n elements as float64 (floats) or in the
    dtype (integers), chosen so every reduction in every order is exact in the dtype."""
    rng = rng_for(seed, 3, it, j, r)
    dtype, op = spec["dtype"], spec["op"]
    _, np_t, is_float = DTYPES[dtype]
    if is_float:
        # Units and how many of them a value may hold: every partial sum of N values then fits
        # the significand (bfloat16 8 bits, float16 11, float32 24, float64 53). A lossy
        # codec gets small values: fp16 has no scale (beyond 65504 is inf) and float64 travels
        # as float32 through the codecs.
        unit, kmax = {"bfloat16": (0.5, 32), "float16": (0.25, 256), "float32": (0.125, 1 << 20),
                      "float64": (0.125, 1 << 40)}[dtype]
        if lossy:
            kmax = min(kmax, 1000)
        if op in ("min", "max"):
            kmax = {"bfloat16": 255, "float16": 2047, "float32": (1 << 23) - 1,
                    "float64": (1 << 50)}[dtype] if not lossy else min(kmax, 1000)
        if op == "prod":
            choices = np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 1.0, 0.0])
            p = np.array([1, 1, 1, 1, 2, 1, 2, 0.02])
            return rng.choice(choices, size=n, p=p / p.sum())
        return rng.integers(-kmax, kmax, size=n, endpoint=True).astype(np.float64) * unit
    info = np.iinfo(np_t)
    full = op in ("min", "max") or (spec["wrap"] and op in ("sum", "prod"))
    if dtype == "uint8" and op == "sum":
        full = True  # 4 x 255 wraps: documented, checked
    if full:
        return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=np_t)
    if op == "prod":
        lo, hi = (0, 3) if dtype == "uint8" else (-3, 3)
        return rng.integers(lo, hi, size=n, endpoint=True, dtype=np_t)
    bound = {"int32": 1 << 20, "int64": 1 << 40, "uint8": 63}[dtype]
    lo = 0 if dtype == "uint8" else -bound
    return rng.integers(lo, bound, size=n, endpoint=True, dtype=np_t)


def to_storage(values, dtype):
    """float64 (exactly representable) or integer values -> the buffer's element type."""
    _, np_t, is_float = DTYPES[dtype]
    if dtype == "bfloat16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(np_t) if is_float else values


def from_storage(arr, dtype):
    """Buffer elements -> float64 (floats) or themselves (integers)."""
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if DTYPES[dtype][2]:
        return arr.astype(np.float64)
    return arr


def reduce_exact(parts, spec, nranks):
    """The exact reduction (integer ops wrap like the library's two's complement; AVG truncates
    toward zero) of equal-length contributions."""
    op, is_float = spec["op"], DTYPES[spec["dtype"]][2]
    acc = parts[0].copy()
    for p in parts[1:]:
        if op in ("sum", "avg"):
            np.add(acc, p, out=acc)
        elif op == "prod":
            np.multiply(acc, p, out=acc)
        elif op == "min":
            np.minimum(acc, p, out=acc)
        else:
            np.maximum(acc, p, out=acc)
    if op == "avg":
        if is_float:
            acc = acc / nranks
        else:
            q = acc // nranks
            q += ((acc % nranks) != 0) & (acc < 0)  # floor -> toward zero
            acc = q.astype(acc.dtype)
    return acc


# ---------------------------------------------------------------------------------------------
# Buffers: two arenas touched once at start-up, so the driver's own memory does not move with
# the sizes drawn and RSS growth is the library's.

class Arena:
    def __init__(self, nbytes):
        self.mem = np.empty(nbytes, dtype=np.uint8)
        self.mem.fill(0x5A)
        self.top = 0

    def reset(self):
        self.top = 0

    def take(self, nelems, dtype, misalign):
        es, np_t, _ = DTYPES[dtype]
        start = (self.top + 63) // 64 * 64 + misalign * es
        end = start + nelems * es
        assert end <= len(self.mem), (nelems, dtype, self.top)
        self.top = end
        return self.mem[start:end].view(np_t)


def address(view):
    return view.ctypes.data


def fill(dst, pat, phase):
    """dst[j] = pat[(phase + j) % len(pat)]: a period-P tiling, copied tile by tile."""
    n, p = len(dst), len(pat)
    j = 0
    while j < n:
        k = (phase + j) % p
        m = min(p - k, n - j)
        dst[j:j + m] = pat[k:k + m]
        j += m


class Check:
    """Compares a result with fill(expected pattern) tile by tile: exact, or relative L2."""

    def __init__(self, dtype, tolerance):
        self.dtype, self.tol = dtype, tolerance
        self.wrong = 0
        self.first = None
        self.err2 = self.ref2 = 0.0
        self.nonfinite = 0
        self.worst = None  # (index, got, expected) of the largest error
        self.n = 0

    def run(self, got, pat, phase, scale=None):
        """scale: float64 pattern of each element's magnitude for the relative error (a sum's
        sum of |contributions|: the codec's error follows the partial sums it encodes, not the
        result, which cancellation may make small); None: |expected|."""
        n, p = len(got), len(pat)
        j = 0
        while j < n:
            k = (phase + j) % p
            m = min(p - k, n - j)
            g, e = got[j:j + m], pat[k:k + m]
            if self.tol == 0.0:
                if DTYPES[self.dtype][2]:
                    bad = from_storage(g, self.dtype) != from_storage(e, self.dtype)
                else:
                    bad = g != e
                nbad = int(np.count_nonzero(bad))
                if nbad:
                    if self.first is None:
                        i = int(np.flatnonzero(bad)[0])
                        self.first = (self.n + j + i, g[i].item(), e[i].item())
                    self.wrong += nbad
            else:
                gf, ef = from_storage(g, self.dtype), from_storage(e, self.dtype)
                fin = np.isfinite(gf)
                nf = m - int(np.count_nonzero(fin))
                if nf and self.first is None:
                    i = int(np.flatnonzero(~fin)[0])
                    self.first = (self.n + j + i, gf[i].item(), ef[i].item())
                self.nonfinite += nf
                d = gf - ef
                if nf:
                    d[~fin] = 0.0
                if m:
                    i = int(np.argmax(np.abs(d)))
                    if self.worst is None or abs(d[i]) > abs(self.worst[1] - self.worst[2]):
                        self.worst = (self.n + j + i, gf[i].item(), ef[i].item())
                self.err2 += float(np.dot(d, d))
                sf = ef if scale is None else scale[k:k + m]
                self.ref2 += float(np.dot(sf, sf))
            j += m
        self.n += n

    def rel(self):
        if self.ref2 == 0.0:
            return 0.0 if self.err2 == 0.0 else math.inf
        return math.sqrt(self.err2 / self.ref2)

    def problem(self):
        """None when the result is right, else what is wrong."""
        if self.tol == 0.0:
            if self.wrong:
                idx, g, e = self.first
                return f"{self.wrong} of {self.n} elements wrong, first at {idx}: got {g}, " \
                       f"expected {e}"
            return None
        if self.nonfinite:
            idx, g, e = self.first
            return f"{self.nonfinite} non-finite elements, first at {idx}: got {g}, " \
                   f"expected {e}"
        if self.rel() > self.tol:
            idx, g, e = self.worst
            return f"relative L2 error {self.rel():.3g} above the bound {self.tol:g} over " \
                   f"{self.n} elements, largest at {idx}: got {g}, expected {e}"
        return None


# ---------------------------------------------------------------------------------------------
# The rank.

def proc_sample(pid="self"):
    """(VmRSS KiB, open fds, threads, /dev/shm segments named gs-<pid>-*) of a process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = len(os.listdir(f"/proc/{pid}/task"))
    real = os.getpid() if pid == "self" else int(pid)
    try:
        segs = sum(1 for n in os.listdir("/dev/shm") if n.startswith(f"gs-{real}-"))
    except OSError:
        segs = -1
    return rss, fds, threads, segs


try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc
    _malloc_trim.argtypes = [ctypes.c_size_t]
except (OSError, AttributeError):
    _malloc_trim = None


def fd_kinds():
    """What this process's fds are ("socket", "anon_inode:[eventfd]", "/dev/shm/...": counts),
    so a boundary record shows what a growing count is made of."""
    kinds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":[")[0] if target.startswith(("socket:", "pipe:")) else target
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


class Fatal(Exception):
    """A collective failed or did not finish: the communicator is unusable, the rank exits."""


class Rank:
    def __init__(self, args):
        import gradstream
        from gradstream import _lib
        self.gs, self.L = gradstream, _lib.lib
        self.args = args
        self.rank, self.n, self.seed = args.rank, args.ranks, args.seed
        self.env_codec = os.environ.get("GS_CODEC")  # GS_* variables win over the options
        self.out = open(os.path.join(args.dir, f"rank{self.rank}.jsonl"), "a", buffering=1)
        self.send_arena = Arena(MAX_BYTES + 4 * MiB)
        self.recv_arena = Arena(MAX_BYTES + 4 * MiB)
        self.comm = None
        self.epoch = -1
        self.comm_opts = None
        self.it = 0
        self.where = "start-up"  # what the rank is doing, for the watchdog and errors
        self.progress = time.monotonic()
        self.counts = {k: 0 for k in KINDS}
        self.counts.update(blocking=0, nonblocking=0, control=0, inplace=0, checked_exact=0,
                           checked_tolerance=0, replica_checks=0, zero_count=0)
        self.bytes_payload = 0
        self.lib_bytes_logical = self.lib_bytes_wire = 0
        self.comms_created = 0
        self.seconds = {"prepare": 0.0, "collectives": 0.0, "check": 0.0}
        self.slowest = (0.0, -1, [])  # (seconds, iteration, its collectives)
        self.failures = 0
        self.max_rel = {}  # codec family -> (error / bound, error, bound, of what): the closest
        self.transports = {}
        self.algorithms = {}
        self._blocking_prototypes()

    def _blocking_prototypes(self):
        """The C API's blocking collectives (the Python layer issues the non-blocking ones)."""
        from gradstream import _lib
        c = ctypes
        p = [_lib.c_ptr, _lib.c_ptr, _lib.c_size, c.c_int, c.c_int, _lib.c_comm, _lib.c_stream]
        for name, argtypes in (("gs_allreduce", p), ("gs_reduce_scatter", p),
                               ("gs_allgather", p[:4] + p[5:]), ("gs_broadcast", p)):
            fn = getattr(self.L, name)
            fn.argtypes = argtypes
            fn.restype = c.c_int

    # -- records --------------------------------------------------------------------------------
    def record(self, **entry):
        entry["t"] = round(time.time() - self.args.t0, 3)
        self.out.write(json.dumps(entry) + "\n")

    def context(self, j=None, spec=None):
        ctx = {"seed": self.seed, "epoch": self.epoch, "iter": self.it, "comm": self.comm_opts}
        if self.env_codec:
            ctx["GS_CODEC"] = self.env_codec  # wins over comm's codec
        if j is not None:
            ctx["op"] = j
            ctx["spec"] = spec
        return ctx

    def wrong(self, what, j, spec, detail):
        self.failures += 1
        ctx = self.context(j, spec)
        self.record(type="failure", what=what, detail=detail, **ctx)
        if self.failures <= 20:
            log(f"rank {self.rank}: WRONG {what}: {detail}; reproduce: seed {self.seed} epoch "
                f"{self.epoch} iter {self.it} op {j} spec {json.dumps(spec)} comm "
                f"{json.dumps(self.comm_opts)}")

    def fatal(self, what, j=None, spec=None):
        self.failures += 1
        ctx = self.context(j, spec)
        self.record(type="failure", what=what, fatal=True, **ctx)
        log(f"rank {self.rank}: FAILED {what}; context {json.dumps(ctx)}")
        raise Fatal(what)

    def boundary(self, label):
        """Resources with no communicator alive and no buffers in flight: comparable points."""
        gc.collect()
        # Freed heap pages glibc keeps would read as growth: hand them back first, so the
        # count is of memory something still holds.
        if _malloc_trim is not None:
            _malloc_trim(0)
        rss, fds, threads, segs = proc_sample()
        self.record(type="boundary", label=label, epoch=self.epoch, iter=self.it, rss_kib=rss,
                    fds=fds, threads=threads, shm_segments=segs, fd_kinds=fd_kinds())

    # -- communicators --------------------------------------------------------------------------
    def codec(self):
        return self.env_codec or self.comm_opts["codec"]

    def open_comm(self, epoch, uid):
        opts, hosts, lifetime = comm_options(self.seed, epoch, self.n)
        self.epoch, self.comm_opts, self.lifetime = epoch, dict(opts), lifetime
        if hosts > 1:
            opts["hostname"] = f"soak-host{self.rank * hosts // self.n}"
            self.comm_opts["hostname"] = f"{hosts} hosts"
        self.where = f"creating communicator {epoch}"
        try:
            self.comm = self.gs.Communicator(uid, self.rank, self.n, **opts)
        except self.gs.GradstreamError as e:
            self.fatal(f"communicator {epoch} creation: {e}")
        self.comms_created += 1
        self.comm_born = time.monotonic()
        st = self.comm.stats()
        self.transports[st["transport"]] = self.transports.get(st["transport"], 0) + 1
        self.record(type="comm", epoch=epoch, first_iter=self.it, options=self.comm_opts,
                    transport=st["transport"])
        if self.rank == 0:
            log(f"communicator {epoch} at iteration {self.it}: {json.dumps(self.comm_opts)} "
                f"-> {st['transport']}")

    def close_comm(self):
        if self.comm is None:
            return
        self.where = f"destroying communicator {self.epoch}"
        try:
            st = self.comm.stats()
            self.lib_bytes_logical += st["bytes_logical"]
            self.lib_bytes_wire += st["bytes_wire"]
            if st["errors"]:
                self.fatal(f"communicator {self.epoch} counts {st['errors']} errors")
            self.comm.destroy()
        except self.gs.GradstreamError as e:
            self.fatal(f"destroy of communicator {self.epoch}: {e}")
        self.comm = None

    def publish_uid(self, epoch):
        """The unique id of communicator `epoch`: rank 0 makes it and writes it to a file
        (written, then renamed into place), the others read it. Not over the old communicator:
        then rank 0's listener would be open, and peers connecting to it, when the resources
        between communicators are counted."""
        path = os.path.join(self.args.dir, f"uid{epoch}")
        if self.rank == 0:
            uid = self.gs.unique_id()
            with open(path + ".tmp", "wb") as f:
                f.write(uid)
            os.rename(path + ".tmp", path)
            try:  # every rank has joined the previous communicator: its id is spent
                os.unlink(os.path.join(self.args.dir, f"uid{epoch - 1}"))
            except FileNotFoundError:
                pass
            return uid
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with open(path, "rb") as f:
                    uid = f.read()
                if len(uid) == UID_BYTES:
                    return uid
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        self.fatal(f"no unique id for communicator {epoch} from rank 0 within 120 s")

    # -- calls ----------------------------------------------------------------------------------
    def deadline_s(self):
        return int(os.environ.get("GS_TIMEOUT_MS", self.comm_opts["timeout_ms"])) / 1000 + 30

    def issue(self, spec, send, recv, blocking, on_done):
        """One collective: blocking through the C call, else through the Python layer."""
        kind, dt = spec["kind"], self.gs.DTYPES[spec["dtype"]]
        op = self.gs.OPS[spec["op"]] if spec["op"] else 0
        c, h = spec["count"], self.comm.handle
        if blocking:
            if kind == "allreduce":
                st = self.L.gs_allreduce(send, recv, c, dt, op, h, None)
            elif kind == "reduce_scatter":
                st = self.L.gs_reduce_scatter(send, recv, c, dt, op, h, None)
            elif kind == "allgather":
                st = self.L.gs_allgather(send, recv, c, dt, h, None)
            else:
                st = self.L.gs_broadcast(send, recv, c, dt, spec["root"], h, None)
            on_done(st, self.gs._lib.last_error() if st else "")
            return
        if kind == "allreduce":
            self.comm.allreduce(send, recv, c, dt, op, on_done)
        elif kind == "reduce_scatter":
            self.comm.reduce_scatter(send, recv, c, dt, op, on_done)
        elif kind == "allgather":
            self.comm.allgather(send, recv, c, dt, on_done)
        else:
            self.comm.broadcast(send, recv, c, dt, spec["root"], on_done)

    def wait_all(self, pending):
        """Waits for [(event, box, j, spec)], each within the deadline."""
        limit = time.monotonic() + self.deadline_s()
        for ev, box, j, spec in pending:
            if not ev.wait(max(0.0, limit - time.monotonic())):
                faulthandler.dump_traceback(all_threads=True)
                self.fatal(f"no completion within {self.deadline_s():.0f} s", j, spec)
            if box[0] != 0:
                self.fatal(f"{spec['kind']} completed with status {box[0]}: {box[1]}", j, spec)

    def done_box(self):
        ev, box = threading.Event(), [None, None]

        def on_done(status, message):
            box[0], box[1] = status, message
            self.progress = time.monotonic()
            ev.set()
        return ev, box, on_done

    def blocking_int_collective(self, kind, send, recv, count, dtype, root=0):
        """Raw control traffic of the soak itself (integers travel raw whatever the codec)."""
        self.counts["control"] += 1
        spec = {"kind": kind, "dtype": dtype, "count": count, "op": None, "root": root}
        ev, box, on_done = self.done_box()
        self.issue(spec, address(send), address(recv), True, on_done)
        if box[0] != 0:
            self.fatal(f"control {kind} failed with status {box[0]}: {box[1]}")

    # -- one collective -------------------------------------------------------------------------
    def prepare(self, j, spec):
        """Buffers filled, patterns of every rank, and what to check afterwards."""
        n = self.n
        kind, dtype = spec["kind"], spec["dtype"]
        lossy_float = DTYPES[dtype][2] and self.effective_codec(spec) != "raw"
        s_el, r_el = buffer_elems(spec, n)
        glob = s_el if kind == "reduce_scatter" else spec["count"]
        plen = max(1, min(glob, PERIOD))
        parts = [contribution(self.seed, self.it, j, r, spec, plen, lossy_float)
                 for r in range(n)]
        if kind in ("allreduce", "reduce_scatter", "stream"):
            expected = to_storage(reduce_exact(parts, spec, n), dtype)
        elif kind == "broadcast":
            expected = to_storage(parts[spec["root"]], dtype)
        else:
            expected = None  # allgather: block r is rank r's pattern
        scale = None
        if lossy_float and spec["op"] in ("sum", "avg"):
            scale = np.sum(np.abs(np.stack(parts)), axis=0) / (n if spec["op"] == "avg" else 1)
        mine = to_storage(parts[self.rank], dtype)
        pats = [to_storage(p, dtype) for p in parts] if kind == "allgather" else None
        mis = spec["misalign"]
        c = spec["count"]
        if spec["inplace"]:
            # NCCL's in-place layouts: rs recv = send + rank*c, ag send = recv + rank*c.
            buf = self.recv_arena.take(max(s_el, r_el), dtype, mis)
            buf.view(np.uint8).fill(0xA5)
            if kind == "reduce_scatter":
                fill(buf, mine, 0)
                send, recv = buf, buf[self.rank * c:(self.rank + 1) * c]
            elif kind == "allgather":
                send = buf[self.rank * c:(self.rank + 1) * c]
                fill(send, mine, 0)
                recv = buf
            else:
                if kind != "broadcast" or self.rank == spec["root"]:
                    fill(buf, mine, 0)
                send = recv = buf
        else:
            send = self.send_arena.take(s_el, dtype, mis)
            recv = self.recv_arena.take(r_el, dtype, mis)
            fill(send, mine, 0)
            recv.view(np.uint8).fill(0xA5)
        return {"j": j, "spec": spec, "send": send, "recv": recv, "expected": expected,
                "mine": mine, "pats": pats, "lossy": lossy_float, "scale": scale}

    def effective_codec(self, spec):
        if spec["kind"] == "stream" and spec.get("stream_codec"):
            return spec["stream_codec"]
        return self.codec()

    def verify(self, prep):
        spec, j = prep["spec"], prep["j"]
        kind, dtype, c = spec["kind"], spec["dtype"], spec["count"]
        codec = self.effective_codec(spec)
        fam = codec_family(codec) if prep["lossy"] else "raw"
        tol = TOLERANCE[fam]
        if spec["op"] == "prod":
            tol *= PROD_FACTOR
        if kind == "stream" and spec["error_feedback"] and spec["iterations"] > 1:
            tol *= 2  # the residual of the previous iteration is added to this one's data
        chk = Check(dtype, tol)
        recv = prep["recv"]
        if kind == "allgather":
            for r in range(self.n):
                chk.run(recv[r * c:(r + 1) * c], prep["pats"][r], 0)
        elif kind == "reduce_scatter":
            chk.run(recv, prep["expected"], self.rank * c, prep["scale"])
        else:
            chk.run(recv, prep["expected"], 0, prep["scale"])
        self.counts["checked_tolerance" if tol else "checked_exact"] += 1
        if tol:
            what = spec["op"] or kind  # the op of a reduction, else the kind
            if kind == "stream" and spec["error_feedback"]:
                what += f" ef x{spec['iterations']} iterations"
            ratio = chk.rel() / tol
            if ratio > self.max_rel.get(fam, (0.0,))[0]:
                self.max_rel[fam] = (ratio, chk.rel(), tol, f"{kind} {dtype} {what}, {c} elements")
        problem = chk.problem()
        if problem:
            self.wrong(f"{kind} result", j, spec, problem)
        if spec["check_send"] and not spec["inplace"]:
            sc = Check(dtype, 0.0)
            sc.run(prep["send"], prep["mine"], 0)
            if sc.problem():
                self.wrong(f"{kind} send buffer changed", j, spec, sc.problem())

    def replica_hash(self, prep):
        return int.from_bytes(hashlib.blake2b(prep["recv"].view(np.uint8).data,
                                              digest_size=8).digest(), "little", signed=True)

    def check_replicas(self, preps):
        """Lossy results of allreduce, allgather, broadcast and streams must be bit-identical on
        every rank (README: the owner keeps decode(encode(x))): an int64 allgather of hashes."""
        todo = [p for p in preps if p["lossy"] and p["spec"]["kind"] != "reduce_scatter"]
        if not todo:
            return
        k = len(todo)
        mine = np.array([self.replica_hash(p) for p in todo], dtype=np.int64)
        everyone = np.zeros(k * self.n, dtype=np.int64)
        self.where = f"iteration {self.it}: replica hashes"
        self.blocking_int_collective("allgather", mine, everyone, k, "int64")
        self.counts["replica_checks"] += k
        table = everyone.reshape(self.n, k)
        for i, p in enumerate(todo):
            if len(set(table[:, i].tolist())) != 1:
                self.wrong(f"{p['spec']['kind']} replicas differ", p["j"], p["spec"],
                           f"result hashes per rank {table[:, i].tolist()}")

    def run_stream(self, prep):
        spec = prep["spec"]
        dt, op = self.gs.DTYPES[spec["dtype"]], self.gs.OPS[spec["op"]]
        buf = prep["recv"]
        try:
            s = self.gs.GradientStream(self.comm, address(buf), spec["count"], dt, op,
                                       codec=spec["stream_codec"],
                                       error_feedback=spec["error_feedback"],
                                       bucket_bytes=spec["bucket_bytes"])
        except self.gs.GradstreamError as e:
            self.fatal(f"gs_stream_open: {e}", prep["j"], spec)
        try:
            for k in range(spec["iterations"]):
                if k:
                    fill(buf, prep["mine"], 0)  # next "gradient": the same contribution again
                ev, box, on_done = self.done_box()
                s.reduce(on_done)
                self.wait_all([(ev, box, prep["j"], spec)])
        except self.gs.GradstreamError as e:
            self.fatal(f"stream reduce: {e}", prep["j"], spec)
        finally:
            try:
                s.close()
            except self.gs.GradstreamError as e:
                self.fatal(f"gs_stream_close: {e}", prep["j"], spec)

    def iteration(self):
        plan = draw_iteration(self.seed, self.it, self.n)
        ops = plan["ops"] if plan["mode"] == "blocking" else fit_batch(plan["ops"], self.n)
        self.send_arena.reset()
        self.recv_arena.reset()
        t_start = time.monotonic()
        preps = [self.prepare(j, spec) for j, spec in enumerate(ops)]
        t_issue = time.monotonic()
        pending = []
        for i, prep in enumerate(preps):
            spec = prep["spec"]
            self.where = f"iteration {self.it} op {i}: {json.dumps(spec)}"
            blocking = plan["mode"] == "blocking" or (plan["end_blocking"] and i == len(preps) - 1)
            try:
                if spec["kind"] == "stream":
                    self.run_stream(prep)
                else:
                    ev, box, on_done = self.done_box()
                    self.issue(spec, address(prep["send"]), address(prep["recv"]), blocking,
                               on_done)
                    if blocking:
                        self.wait_all(pending + [(ev, box, i, spec)])  # already done: checks
                    else:
                        pending.append((ev, box, i, spec))
            except self.gs.GradstreamError as e:
                self.fatal(f"issuing {spec['kind']}: {e}", i, spec)
            self.counts[spec["kind"]] += 1
            self.counts["blocking" if blocking else "nonblocking"] += 1
            self.counts["inplace"] += spec["inplace"]
            self.counts["zero_count"] += spec["count"] == 0
            self.bytes_payload += payload_bytes(spec, self.n)
        self.where = f"iteration {self.it}: waiting for {len(pending)} requests"
        self.wait_all(pending)
        t_done = time.monotonic()
        for prep in preps:
            self.where = f"iteration {self.it} op {prep['j']}: checking"
            self.verify(prep)
        self.check_replicas(preps)
        self.progress = t_end = time.monotonic()
        # Where the time goes: the driver's fills and checks, or the library's collectives.
        self.seconds["prepare"] += t_issue - t_start
        self.seconds["collectives"] += t_done - t_issue
        self.seconds["check"] += t_end - t_done
        if t_done - t_issue > self.slowest[0]:
            self.slowest = (round(t_done - t_issue, 3), self.it,
                            [f"{p['spec']['kind']} {p['spec']['dtype']} "
                             f"{payload_bytes(p['spec'], self.n)} B" for p in preps])

    # -- control --------------------------------------------------------------------------------
    def control(self, stop_at):
        """Rank 0's decision, broadcast: 0 continue, 1 new communicator, 2 stop."""
        msg = np.zeros(2, dtype=np.int64)
        if self.rank == 0:
            now = time.monotonic()
            if now - getattr(self, "last_note", 0.0) >= self.args.interval:
                self.last_note = now
                done = sum(self.counts[k] for k in KINDS)
                log(f"iteration {self.it}: {done} collectives, "
                    f"{self.bytes_payload / 2**30:.2f} GiB of buffers, {self.failures} failures")
            if stop_at is not None and self.it >= stop_at:
                msg[0] = 2
            elif stop_at is None and now - self.args.start_mono >= self.args.duration:
                msg[0] = 2
            elif stop_at is None and now - self.comm_born >= self.lifetime:
                msg[0] = 1
        out = np.zeros(2, dtype=np.int64)
        self.where = f"iteration {self.it}: control broadcast"
        self.blocking_int_collective("broadcast", msg, out, 2, "int64", root=0)
        return int(out[0])

    def renew(self):
        epoch = self.epoch + 1
        self.close_comm()
        self.boundary("between")
        self.where = f"iteration {self.it}: waiting for the unique id of communicator {epoch}"
        self.open_comm(epoch, self.publish_uid(epoch))

    def watchdog(self):
        """No progress for the deadline plus a margin: say where, dump the stacks, exit."""
        while True:
            time.sleep(5)
            idle = time.monotonic() - self.progress
            limit = (self.deadline_s() if self.comm_opts else 120) + 60
            if idle > limit:
                log(f"rank {self.rank}: HANG: no progress for {idle:.0f} s in {self.where} "
                    f"(seed {self.seed} epoch {self.epoch} iter {self.it})")
                self.record(type="failure", what=f"hang in {self.where}", fatal=True,
                            **self.context())
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    def run(self):
        threading.Thread(target=self.watchdog, daemon=True).start()
        self.boundary("start")
        replay = self.args.replay
        if replay:
            epoch, first, last = replay
            self.it = first
            self.open_comm(epoch, self.publish_uid(epoch))
            stop_at = last
        else:
            self.open_comm(0, self.publish_uid(0))
            stop_at = None
        while True:
            self.progress = time.monotonic()
            self.where = f"iteration {self.it}"
            self.iteration()
            self.it += 1
            if self.it % CONTROL_EVERY == 0 or (stop_at is not None and self.it > stop_at):
                action = self.control(None if stop_at is None else stop_at + 1)
                if action == 2:
                    break
                if action == 1:
                    self.renew()
        self.close_comm()
        self.boundary("end")

    def summary(self, status):
        return {"rank": self.rank, "status": status, "iterations": self.it,
                "counts": self.counts, "bytes_payload": self.bytes_payload,
                "lib_bytes_logical": self.lib_bytes_logical,
                "lib_bytes_wire": self.lib_bytes_wire, "comms_created": self.comms_created,
                "failures": self.failures, "max_rel": self.max_rel,
                "transports": self.transports, "seed": self.seed,
                "seconds": self.seconds, "slowest": self.slowest,
                "version": self.gs.__version__, "library": self.gs.library_path,
                "env_codec": self.env_codec}


def rank_main(args):
    faulthandler.enable()
    with open(os.path.join(args.dir, f"rank{args.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    rank = Rank(args)
    status = "ok"
    try:
        rank.run()
    except Fatal:
        status = "fatal"
    except Exception as e:  # a bug of this driver or an unexpected library exception
        import traceback
        traceback.print_exc()
        rank.failures += 1
        rank.record(type="failure", what=f"exception {e!r} in {rank.where}", fatal=True,
                    **rank.context())
        status = "exception"
    with open(os.path.join(args.dir, f"rank{args.rank}.json"), "w") as f:
        json.dump(rank.summary(status), f)
    rank.out.close()
    sys.stderr.flush()
    if status != "ok":
        # The communicator is broken and peers may be gone: do not wait in atexit's destroy.
        os._exit(2)
    return 0 if rank.failures == 0 else 1


# ---------------------------------------------------------------------------------------------
# The sampler.

def monitor_main(args):
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pids = {}
    path = os.path.join(args.dir, "samples.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        head = ["t_s"]
        for r in range(args.ranks):
            head += [f"rss{r}_kib", f"fds{r}", f"threads{r}", f"shm{r}"]
        w.writerow(head)
        next_t = time.monotonic()
        while not stop.is_set():
            for r in range(args.ranks):
                if r not in pids:
                    try:
                        with open(os.path.join(args.dir, f"rank{r}.pid")) as p:
                            pids[r] = int(p.read())
                    except (FileNotFoundError, ValueError):
                        pass
            if len(pids) == args.ranks:
                row = [round(time.time() - args.t0, 1)]
                alive = 0
                for r in range(args.ranks):
                    try:
                        row += list(proc_sample(pids[r]))
                        alive += 1
                    except (FileNotFoundError, ProcessLookupError):
                        row += ["", "", "", ""]
                if alive == 0:
                    break
                w.writerow(row)
                f.flush()
                next_t += args.interval
            else:
                next_t = time.monotonic() + 0.2  # ranks still starting
            stop.wait(max(0.0, next_t - time.monotonic()))
    return 0


# ---------------------------------------------------------------------------------------------
# The report.

def growth(series, warmup, end, slack_frac, slack_kib):
    """(first-third max, last-third max, verdict) of [(t, value)] after warm-up; verdict None when
    a third holds fewer than 2 points (too short to judge)."""
    pts = [(t, v) for t, v in series if t >= warmup]
    if not pts:
        return None, None, None
    span = max(end - warmup, 1e-9)
    first = [v for t, v in pts if t < warmup + span / 3]
    last = [v for t, v in pts if t >= warmup + 2 * span / 3]
    if len(first) < 2 or len(last) < 2:
        return (max(first) if first else None), (max(last) if last else None), None
    a, b = max(first), max(last)
    return a, b, b <= a * (1 + slack_frac) + slack_kib


def report_main(args):
    n, d = args.ranks, args.dir
    slack_frac, slack_kib = 0.10, 16 * 1024
    failed = []
    summaries = {}
    codes = {}
    try:
        with open(os.path.join(d, "exit_codes")) as f:
            for line in f:
                r, c = line.split()
                codes[int(r)] = int(c)
    except FileNotFoundError:
        pass
    for r in range(n):
        try:
            with open(os.path.join(d, f"rank{r}.json")) as f:
                summaries[r] = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            if codes.get(r, 0) in (0, 1):  # a killed rank's status says it already
                failed.append(f"rank {r} wrote no summary (see its log)")
    meaning = {1: "wrong results", 2: "a collective failed", 3: "hang (watchdog)",
               124: "ran past its timeout", 137: "SIGKILL", 143: "SIGTERM (ended by soak.sh "
               "after another rank failed, or from outside)"}
    for r, c in sorted(codes.items()):
        if c != 0:
            failed.append(f"rank {r} exited with status {c} ({meaning.get(c, 'see its log')})")
    records = {r: [] for r in range(n)}
    for r in range(n):
        try:
            with open(os.path.join(d, f"rank{r}.jsonl")) as f:
                records[r] = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            pass
    bad = [(r, e) for r in range(n) for e in records[r] if e["type"] == "failure"]
    if bad:
        failed.append(f"{len(bad)} failure records (wrong results, failed or hung collectives)")
    rows = []
    try:
        with open(os.path.join(d, "samples.csv")) as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        pass

    duration = args.duration
    end = max([float(x["t_s"]) for x in rows] + [e["t"] for r in records for e in records[r]]
              + [0.0])
    warmup = args.warmup if args.warmup is not None else min(60.0, duration / 4)

    print(f"\n# samples every {args.interval:g} s (RSS MiB / open fds / threads per rank); "
          f"warm-up {warmup:g} s")
    head = f"{'t_s':>7}" + "".join(f" | r{r} rss  fds thr" for r in range(n))
    print(head)
    for x in rows:
        line = f"{float(x['t_s']):7.1f}"
        for r in range(n):
            if x[f"rss{r}_kib"] == "":
                line += " |    -    -   -"
            else:
                line += f" | {int(x[f'rss{r}_kib']) / 1024:6.1f} {int(x[f'fds{r}']):4d} " \
                        f"{int(x[f'threads{r}']):3d}"
        print(line)

    # Growth after warm-up, max of the first third against max of the last third:
    #  - RSS within x 1.10 + 16 MiB, in the 10 s samples and in each rank's own samples taken
    #    between communicators;
    #  - fds, threads and /dev/shm segments not above at all, in the samples between
    #    communicators (nothing of the library alive, so the count is the same every time);
    #    in the 10 s samples they depend on the live communicator's options (tcp sockets per
    #    peer, shm or not), so there they are shown, not judged.
    print("\n# growth after warm-up: max of the first third -> max of the last third "
          "(RSS bound x1.10 + 16 MiB; fds, threads, shm segments between communicators: none)")
    judged = False
    for r in range(n):
        def series(key, src):
            if src == "10s":
                return [(float(x["t_s"]), int(x[key.format(r)])) for x in rows
                        if x[key.format(r)] != ""]
            return [(e["t"], e[key]) for e in records[r]
                    if e["type"] == "boundary" and e["label"] == "between"]
        checks = [("10s", "rss{}_kib", True, True), ("10s", "fds{}", False, False),
                  ("10s", "threads{}", False, False),
                  ("between", "rss_kib", True, True), ("between", "fds", False, True),
                  ("between", "threads", False, True), ("between", "shm_segments", False, True)]
        parts = []
        for src, key, is_rss, judge in checks:
            a, b, ok = growth(series(key, src), warmup, end,
                              slack_frac if is_rss else 0.0, slack_kib if is_rss else 0)
            name = f"{src} {key.replace('{}', '').replace('_kib', '')}"
            if a is None:
                parts.append(f"{name} -")
                continue
            fmt = (lambda v: f"{v / 1024:.1f}M") if is_rss else (lambda v: str(v))
            if not judge:
                verdict = ""
            else:
                verdict = "" if ok else (" (too short to judge)" if ok is None else " GREW")
            parts.append(f"{name} {fmt(a)}->{fmt(b) if b is not None else '-'}{verdict}")
            if judge and ok is not None:
                judged = True
            if judge and ok is False:
                failed.append(f"rank {r}: {name} grew after warm-up: {fmt(a)} -> {fmt(b)}")
        print(f"rank {r}: " + ", ".join(parts))
    if not judged:
        print("(the run is too short to judge growth: each third after warm-up needs 2 samples)")

    # Figures.
    if summaries:
        s0 = summaries[min(summaries)]
        kinds = {k: s0["counts"][k] for k in KINDS}
        total = sum(kinds.values())
        c = s0["counts"]
        print("\n# figures (rank 0's counts; every rank issues the same calls)")
        print(f"library {s0['version']} ({s0['library']}), seed {s0['seed']}"
              + (f", GS_CODEC={s0['env_codec']} for every communicator" if s0["env_codec"]
                 else ""))
        print(f"iterations {s0['iterations']}, collectives {total} ("
              + ", ".join(f"{k} {v}" for k, v in kinds.items())
              + f"), blocking {c['blocking']} / non-blocking {c['nonblocking']}, in place "
              f"{c['inplace']}, count 0: {c['zero_count']}; checked exactly {c['checked_exact']},"
              f" within codec bounds {c['checked_tolerance']}, replica hash checks "
              f"{c['replica_checks']}; control collectives {c['control']}")
        pay = sum(s["bytes_payload"] for s in summaries.values())
        logical = sum(s["lib_bytes_logical"] for s in summaries.values())
        wire = sum(s["lib_bytes_wire"] for s in summaries.values())
        print(f"bytes: buffers {pay / 2**30:.2f} GiB over all ranks; the library's "
              f"bytes_logical {logical / 2**30:.2f} GiB, bytes_wire {wire / 2**30:.2f} GiB")
        print(f"communicators created {s0['comms_created']} per rank, transports "
              + ", ".join(f"{k} x{v}" for k, v in sorted(s0["transports"].items())))
        sec = s0["seconds"]
        slow = s0["slowest"]
        print(f"rank 0's time: fills {sec['prepare']:.1f} s, collectives (issue to completion) "
              f"{sec['collectives']:.1f} s, checks {sec['check']:.1f} s; slowest iteration "
              f"{slow[1]} ({slow[0]:.2f} s of collectives: {', '.join(slow[2])})")
        rel = {}
        for s in summaries.values():
            for k, v in s["max_rel"].items():
                rel[k] = max(rel.get(k, (0.0,)), tuple(v))
        if rel:
            print("closest to its bound, per codec: relative L2 error / bound (what): "
                  + "; ".join(f"{k} {v:.2g} / {b:.2g} ({w})"
                              for k, (_, v, b, w) in sorted(rel.items())))
        for r in range(n):
            b = [e for e in records[r] if e["type"] == "boundary"]
            if b:
                print(f"rank {r}: RSS {b[0]['rss_kib'] / 1024:.1f} -> {b[-1]['rss_kib'] / 1024:.1f}"
                      f" MiB, fds {b[0]['fds']} -> {b[-1]['fds']}, threads {b[0]['threads']} -> "
                      f"{b[-1]['threads']} (start -> {b[-1]['label']}, no communicator alive)")
    for r, e in bad[:20]:
        print(f"FAILURE rank {r}: {e['what']}" + (f": {e['detail']}" if e.get("detail") else "")
              + f" (seed {e['seed']} epoch {e['epoch']} iter {e['iter']}"
              + (f" op {e['op']} spec {json.dumps(e['spec'])}" if "op" in e else "")
              + f" comm {json.dumps(e['comm'])})")
    if failed:
        print("\nsoak: FAIL: " + "; ".join(dict.fromkeys(failed)))
        return 1
    print("\nsoak: PASS: every result right, no failure"
          + (", no growth after warm-up" if judged else " (growth not judged: too short)"))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="role", required=True)
    a = sub.add_parser("rank")
    a.add_argument("--rank", type=int, required=True)
    a.add_argument("--replay", help="EPOCH:FIRST_ITER:LAST_ITER: communicator EPOCH's options, "
                   "iterations FIRST..LAST only")
    for q in (a, sub.add_parser("monitor"), sub.add_parser("report")):
        q.add_argument("--ranks", type=int, default=4)
        q.add_argument("--dir", required=True)
        q.add_argument("--t0", type=float, default=None, help="start (time.time()) of the run")
        q.add_argument("--seed", type=int, default=1)
        q.add_argument("--duration", type=float, default=600)
        q.add_argument("--interval", type=float, default=10)
        q.add_argument("--warmup", type=float, default=None)
    args = p.parse_args()
    if args.t0 is None:
        args.t0 = time.time()
    global T0
    T0 = args.t0
    if args.role == "rank":
        args.start_mono = time.monotonic()
        if args.replay:
            e, i0, i1 = (int(x) for x in args.replay.split(":"))
            args.replay = (e, i0, i1)
        return rank_main(args)
    if args.role == "monitor":
        return monitor_main(args)
    return report_main(args)


if __name__ == "__main__":
    sys.exit(main())
