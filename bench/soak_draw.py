"""The soak's draws (bench/soak.py): what each communicator and each iteration does, as
functions of the seed alone, so that every rank issues the same calls in the same order and a
failure names the (seed, communicator, iteration) that reproduces it."""
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
