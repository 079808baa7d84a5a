"""Completion callbacks from the library's progress thread into Python.

One ctypes trampoline serves every request: the C side gets an integer token as user_data and
the trampoline looks the Python callable up. ctypes takes the GIL for the call, so callables run
on the communicator's progress thread with the GIL held: they must be short and must not wait
for other work of the same communicator.
"""
import itertools
import sys
import threading
import traceback

from . import _lib

_pending = {}
_tokens = itertools.count(1)
_lock = threading.Lock()
_here = threading.local()  # .running: this thread is inside a completion callback


def in_callback():
    """Whether the calling thread runs a completion callback (the progress thread, inside one):
    a blocking call of the same communicator there would wait for the request running it."""
    return getattr(_here, "running", False)


def _trampoline(status, message, user_data):
    with _lock:
        fn = _pending.pop(user_data or 0, None)
    if fn is None:
        return
    _here.running = True
    try:
        fn(status, message.decode(errors="replace") if message else "")
    except BaseException:  # never let an exception unwind into C
        traceback.print_exc(file=sys.stderr)
    finally:
        _here.running = False


_TRAMPOLINE = _lib.COMPLETION_FN(_trampoline)  # kept alive for the life of the module


def register(fn):
    """A token for fn; pass it as user_data with TRAMPOLINE. fn(status, message) runs once."""
    token = next(_tokens)
    with _lock:
        _pending[token] = fn
    return token


def forget(token):
    """Drops fn when registering it with the library failed (it will never be called)."""
    with _lock:
        _pending.pop(token, None)


TRAMPOLINE = _TRAMPOLINE
