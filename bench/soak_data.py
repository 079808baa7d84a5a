"""The soak's data (bench/soak.py): each rank's contributions, their exact reduction, the two
buffer arenas and the check of every result against the exact one."""
import math

import numpy as np

from soak_draw import DTYPES, rng_for


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
