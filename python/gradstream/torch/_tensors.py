"""Tensors as gradstream buffers: dtype and op names, devices, contiguous staging."""
import torch
import torch.distributed as dist

from .. import _lib

DTYPES = {
    torch.float32: _lib.DTYPES["float32"],
    torch.float64: _lib.DTYPES["float64"],
    torch.float16: _lib.DTYPES["float16"],
    torch.bfloat16: _lib.DTYPES["bfloat16"],
    torch.int32: _lib.DTYPES["int32"],
    torch.int64: _lib.DTYPES["int64"],
    torch.uint8: _lib.DTYPES["uint8"],
}

# Bytes per element, by gradstream dtype.
ELEMENT_BYTES = {gs: torch.empty(0, dtype=t).element_size() for t, gs in DTYPES.items()}

_R = dist.ReduceOp.RedOpType
OPS = {
    _R.SUM: _lib.OPS["sum"],
    _R.AVG: _lib.OPS["avg"],
    _R.MIN: _lib.OPS["min"],
    _R.MAX: _lib.OPS["max"],
    _R.PRODUCT: _lib.OPS["prod"],
}


def gs_dtype(t, what):
    try:
        return DTYPES[t.dtype]
    except KeyError:
        names = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
        raise TypeError(f"gradstream: {what} has dtype {str(t.dtype).replace('torch.', '')}, "
                        f"which gradstream does not reduce or move (supported: {names})") from None


def gs_op(reduce_op):
    op = reduce_op.op if hasattr(reduce_op, "op") else reduce_op
    for kind, value in OPS.items():
        if op == kind:
            return value
    raise ValueError(f"gradstream: reduce op {op} is not supported (SUM, AVG, MIN, MAX, "
                     "PRODUCT are)")


def check_tensor(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gradstream: {what} is a {type(t).__name__}, not a tensor")
    if t.is_sparse or t.layout != torch.strided:
        raise TypeError(f"gradstream: {what} is a {t.layout} tensor; only dense (strided) "
                        "tensors are supported")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"gradstream: {what} is on {t.device}; gradstream takes cpu and cuda "
                        "tensors")
    if t.device.type == "cuda" and not t.is_contiguous():
        raise ValueError(f"gradstream: {what} is a non-contiguous CUDA tensor; pass "
                         ".contiguous() (only CPU tensors are staged through a contiguous copy)")
    gs_dtype(t, what)


def same_device(tensors, what):
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"gradstream: {what} are on several devices ({sorted(map(str, devices))});"
                         " one call takes tensors of one device")
    return next(iter(devices))


def cuda_stream(device):
    """The current CUDA stream of device as the address the C API takes (None for CPU)."""
    if device.type != "cuda":
        return None
    return torch.cuda.current_stream(device).cuda_stream


def contiguous(t):
    """(buffer, write_back): a contiguous tensor with t's values, and a function copying the
    buffer's result back into t where t was not contiguous itself (None when it was)."""
    if t.is_contiguous():
        return t, None
    staged = t.contiguous()
    return staged, (lambda: t.copy_(staged))


def new_future(device):
    if device.type == "cuda":
        return torch.futures.Future(devices=[device])
    return torch.futures.Future()
