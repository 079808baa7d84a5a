"""A gradstream communicator over raw buffers (addresses and element counts).

The torch layer (gradstream.torch) turns tensors into these calls. Every collective here is
non-blocking: it queues a request on the communicator's progress thread and calls
``on_done(status, message)`` from that thread once the results are in place. Point-to-point
has both forms: send/recv block the caller, isend/irecv take on_done like the collectives.
"""
import atexit
import ctypes
import threading
import weakref

from . import _completion, _lib
from .errors import GradstreamError, check

_CONFIG_STRINGS = ("transport", "codec", "metrics_address", "codec_ladder", "codec_floor", "algo",
                   "hostname")
_CONFIG_NUMBERS = ("timeout_ms", "chunk_bytes", "slots_per_peer", "sockets_per_peer",
                   "chunk_min_bytes", "chunk_max_bytes", "error_budget", "shm", "staging_bytes")

_live = weakref.WeakSet()  # communicators not destroyed yet, destroyed at exit


def _config(options):
    """A gs_config_t from keyword options (None: the library default; GS_* variables win)."""
    cfg = _lib.Config()
    check(_lib.lib.gs_config_init(ctypes.byref(cfg)), "gs_config_init")
    keep = []  # the encoded strings must outlive the call that reads them
    for key, value in options.items():
        if value is None:
            continue
        if key in _CONFIG_STRINGS:
            encoded = str(value).encode()
            keep.append(encoded)
            setattr(cfg, key, encoded)
        elif key in _CONFIG_NUMBERS:
            setattr(cfg, key, int(value) if key != "error_budget" else float(value))
        else:
            raise ValueError(f"gradstream: unknown communicator option '{key}' (options: "
                             f"{', '.join(_CONFIG_STRINGS + _CONFIG_NUMBERS)})")
    return cfg, keep


def unique_id():
    """Rank 0's rendezvous token (starts its listener): 128 bytes to hand to every rank."""
    uid = _lib.UniqueId()
    check(_lib.lib.gs_get_unique_id(ctypes.byref(uid)), "gs_get_unique_id")
    return ctypes.string_at(ctypes.addressof(uid), _lib.UNIQUE_ID_BYTES)


class Communicator:
    """One rank's membership in a gradstream communicator (gs_comm_t).

    Creation is collective: every rank passes the same unique id (see unique_id() and
    from_store()). Options are gs_config_t's fields (transport, timeout_ms, codec, chunk_bytes,
    algo, shm, ...); GS_* environment variables override them, as in C.
    """

    def __init__(self, uid, rank, size, **options):
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != _lib.UNIQUE_ID_BYTES:
            raise ValueError(f"gradstream: uid must be {_lib.UNIQUE_ID_BYTES} bytes from "
                             "unique_id()")
        cfg, keep = _config(options)
        cid = _lib.UniqueId()
        ctypes.memmove(ctypes.addressof(cid), bytes(uid), _lib.UNIQUE_ID_BYTES)
        handle = _lib.c_comm()
        check(_lib.lib.gs_comm_init_rank_version(ctypes.byref(handle), int(size),
                                                  ctypes.byref(cid), int(rank), ctypes.byref(cfg),
                                                  _lib.API_VERSION), "gs_comm_init_rank")
        del keep
        self._adopt(handle, rank, size)

    def _adopt(self, handle, rank, size):
        self._handle = handle
        self._lock = threading.Lock()
        self.rank = int(rank)
        self.size = int(size)
        _live.add(self)

    def split(self, color, key=0, **options):
        """gs_comm_split (collective): a Communicator of the ranks with this color (>= 0),
        ranked by key then rank, or None for color -1 (GS_SPLIT_NOCOLOR). Options: the child's
        settings (none: this communicator's)."""
        out = _lib.c_comm()
        cfg, keep = _config(options) if options else (None, None)
        check(_lib.lib.gs_comm_split(self.handle, int(color), int(key),
                                     ctypes.byref(cfg) if cfg is not None else None,
                                     ctypes.byref(out)), "gs_comm_split")
        del keep
        if not out:
            return None
        rank, size = ctypes.c_int(), ctypes.c_int()
        check(_lib.lib.gs_comm_rank(out, ctypes.byref(rank)), "gs_comm_rank")
        check(_lib.lib.gs_comm_size(out, ctypes.byref(size)), "gs_comm_size")
        child = Communicator.__new__(Communicator)
        child._adopt(out, rank.value, size.value)
        return child

    @classmethod
    def from_store(cls, store, rank, size, key="gradstream/unique_id", **options):
        """Rendezvous through a key-value store with set(key, bytes) and get(key) -> bytes that
        blocks until the key exists (torch.distributed's Store): rank 0 publishes the id."""
        if rank == 0:
            uid = unique_id()
            store.set(key, uid)
        else:
            uid = bytes(store.get(key))
        return cls(uid, rank, size, **options)

    @property
    def handle(self):
        if self._handle is None:
            raise GradstreamError(-7, "the communicator was destroyed", "use")
        return self._handle

    def _issue(self, call, args, stream, on_done):
        """Queues a request; on_done(status, message) runs when it completes (then freed)."""
        request = _lib.c_request()
        check(getattr(_lib.lib, call)(*args, self.handle, stream, ctypes.byref(request)), call)

        def finished(status, message):
            _lib.lib.gs_request_free(request)  # done: returns at once
            on_done(status, message)

        token = _completion.register(finished)
        status = _lib.lib.gs_request_on_complete(request, _completion.TRAMPOLINE, token)
        if status != _lib.GS_OK:
            _completion.forget(token)
            message = _lib.last_error()
            _lib.lib.gs_wait(request, -1)
            _lib.lib.gs_request_free(request)
            raise GradstreamError(status, message, "gs_request_on_complete")

    def allreduce(self, send, recv, count, dtype, op, on_done, stream=None, inline=False):
        """inline: the blocking gs_allreduce on this thread, reported through on_done before
        returning (small host buffers: the request and the progress thread's hand-off cost far
        more than the call). Issue order holds either way: a blocking call waits for the
        requests queued before it. Not inside a completion callback (future.then() chains run
        there), where the blocking call would wait for the request that runs the callback."""
        if inline and not _completion.in_callback():
            status = _lib.lib.gs_allreduce(send, recv, count, dtype, op, self.handle, stream)
            on_done(status, _lib.last_error() if status != _lib.GS_OK else "")
            return
        self._issue("gs_iallreduce", (send, recv, count, dtype, op), stream, on_done)

    def reduce_scatter(self, send, recv, recvcount, dtype, op, on_done, stream=None):
        self._issue("gs_ireduce_scatter", (send, recv, recvcount, dtype, op), stream, on_done)

    def allgather(self, send, recv, sendcount, dtype, on_done, stream=None):
        self._issue("gs_iallgather", (send, recv, sendcount, dtype), stream, on_done)

    def broadcast(self, send, recv, count, dtype, root, on_done, stream=None):
        self._issue("gs_ibroadcast", (send, recv, count, dtype, root), stream, on_done)

    def reduce(self, send, recv, count, dtype, op, root, on_done, stream=None):
        """recv is written on root only (it may be 0 elsewhere)."""
        self._issue("gs_ireduce", (send, recv, count, dtype, op, root), stream, on_done)

    def alltoall(self, send, recv, count, dtype, on_done, stream=None):
        """count elements per peer: block j of send to rank j, block i of recv from rank i."""
        self._issue("gs_ialltoall", (send, recv, count, dtype), stream, on_done)

    def alltoallv(self, send, sendcounts, sdispls, recv, recvcounts, rdispls, dtype, on_done,
                  stream=None):
        """Counts and displacements in elements, one per rank (the call copies them)."""
        arrays = [(_lib.c_size * len(a))(*a) for a in (sendcounts, sdispls, recvcounts, rdispls)]
        self._issue("gs_ialltoallv", (send, arrays[0], arrays[1], recv, arrays[2], arrays[3],
                                      dtype), stream, on_done)

    # Point-to-point: messages between two ranks match in posting order (no tags); a send
    # completes once peer received all of it, so two ranks exchanging use isend/irecv.
    def send(self, buff, count, dtype, peer, stream=None):
        """Blocks until rank peer received the message (ctypes drops the GIL meanwhile)."""
        check(_lib.lib.gs_send(buff, count, dtype, int(peer), self.handle, stream), "gs_send")

    def recv(self, buff, count, dtype, peer, stream=None):
        """Blocks until the next message from rank peer is in buff."""
        check(_lib.lib.gs_recv(buff, count, dtype, int(peer), self.handle, stream), "gs_recv")

    def isend(self, buff, count, dtype, peer, on_done, stream=None):
        """on_done runs once peer received the message; buff must stay unchanged until then."""
        self._issue("gs_isend", (buff, count, dtype, int(peer)), stream, on_done)

    def irecv(self, buff, count, dtype, peer, on_done, stream=None):
        self._issue("gs_irecv", (buff, count, dtype, int(peer)), stream, on_done)

    def register(self, buff, size):
        """gs_comm_register: promises [buff, buff + size) stays allocated until deregister(),
        so the transports keep its registration across calls (verbs pins pages once instead of
        at every call; counted in stats()["buffer_registrations"]). Returns the handle."""
        handle = ctypes.c_void_p()
        check(_lib.lib.gs_comm_register(self.handle, buff, size, ctypes.byref(handle)),
              "gs_comm_register")
        return handle.value

    def deregister(self, handle):
        """gs_comm_deregister: drops what register() kept (a second call is an error)."""
        check(_lib.lib.gs_comm_deregister(self.handle, handle), "gs_comm_deregister")

    def barrier(self):
        """Blocks until every rank called it (after this rank's earlier requests)."""
        check(_lib.lib.gs_barrier(self.handle), "gs_barrier")

    def stats(self):
        """gs_comm_stats as a dict (bytes_logical, bytes_wire, compression_ratio, transport...)."""
        st = _lib.CommStats()
        st.struct_size = ctypes.sizeof(st)
        check(_lib.lib.gs_comm_stats(self.handle, ctypes.byref(st)), "gs_comm_stats")
        out = {}
        for name, ctype in st._fields_:
            if name == "struct_size":
                continue
            value = getattr(st, name)
            out[name] = value.decode(errors="replace") if isinstance(value, bytes) else value
        return out

    def abort(self):
        """gs_comm_abort: requests in flight fail with GS_ERR_ABORTED, peers are told."""
        with self._lock:
            if self._handle is not None:
                check(_lib.lib.gs_comm_abort(self._handle), "gs_comm_abort")

    def destroy(self):
        """Waits (bounded by the timeout) for queued requests, then frees the communicator."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            _live.discard(self)
            check(_lib.lib.gs_comm_destroy(handle), "gs_comm_destroy")

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass


class GradientStream:
    """gs_stream_t: a buffer allreduced in place bucket by bucket, with optional error feedback
    (the residual of a lossy codec kept per element, added next iteration)."""

    def __init__(self, comm, buffer, count, dtype, op, codec=None, error_feedback=False,
                 bucket_bytes=None, stream=None):
        cfg = _lib.StreamConfig()
        check(_lib.lib.gs_stream_config_init(ctypes.byref(cfg)), "gs_stream_config_init")
        self._codec = codec.encode() if codec else None
        cfg.codec = self._codec
        cfg.error_feedback = 1 if error_feedback else 0
        if bucket_bytes is not None:
            cfg.bucket_bytes = int(bucket_bytes)
        cfg.cuda_stream = stream
        handle = ctypes.c_void_p()
        check(_lib.lib.gs_stream_open(comm.handle, buffer, count, dtype, op, ctypes.byref(cfg),
                                      ctypes.byref(handle)), "gs_stream_open")
        self._handle = handle
        self._comm = comm  # the communicator must outlive the stream
        self.count = count

    def reduce(self, on_done):
        """One iteration over the whole buffer: on_done(status, message) once it is reduced."""
        check(_lib.lib.gs_stream_begin(self._handle), "gs_stream_begin")
        check(_lib.lib.gs_stream_ready(self._handle, 0, self.count), "gs_stream_ready")
        token = _completion.register(on_done)
        status = _lib.lib.gs_stream_on_complete(self._handle, _completion.TRAMPOLINE, token)
        if status != _lib.GS_OK:
            _completion.forget(token)
            check(status, "gs_stream_on_complete")

    def residual_bytes(self):
        n = ctypes.c_size_t()
        check(_lib.lib.gs_stream_residual_bytes(self._handle, ctypes.byref(n)),
              "gs_stream_residual_bytes")
        return n.value

    def save_residual(self, address, nbytes):
        check(_lib.lib.gs_stream_save_residual(self._handle, address, nbytes),
              "gs_stream_save_residual")

    def load_residual(self, address, nbytes):
        check(_lib.lib.gs_stream_load_residual(self._handle, address, nbytes),
              "gs_stream_load_residual")

    def close(self):
        handle, self._handle = self._handle, None
        if handle is not None:
            check(_lib.lib.gs_stream_close(handle), "gs_stream_close")


@atexit.register
def _destroy_all():
    # A communicator alive at interpreter exit would call back into a finalizing interpreter.
    for comm in list(_live):
        try:
            comm.destroy()
        except Exception:
            pass
