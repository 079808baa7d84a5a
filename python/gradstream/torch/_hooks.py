"""DDP communication hooks: each gradient bucket averaged by gradstream with a codec, optionally
with error feedback (the residual of the lossy codec kept in the library, per bucket).

    state = GradstreamState(codec="int8", error_feedback=True)
    ddp.register_comm_hook(state, comm_hook)

Each DDP bucket gets a gradstream gradient stream over its flat buffer (gs_stream_open with the
state's codec): one iteration per backward pass, averaged in place (GS_AVG), completed on the
progress thread (gs_stream_on_complete), so the hook's future needs no waiting thread.

Residuals follow the parameters, not the buffers: DDP rebuilds its buckets after the first
iteration (buffers move, parameters regroup), so when a bucket's layout changes the state saves
the residuals of the streams that held its parameters (per parameter), reopens the bucket's
stream over the new buffer and loads the parameters' residuals in the new order. state_dict() / load_state_dict() save and restore them
(keys: parameter names when the state was given the model, else the order in which the hook
first saw the parameters, which is deterministic for a given model and bucket_cap_mb).
"""
import threading

import torch
import torch.distributed as dist

from .. import _comm, _lib
from ..errors import GradstreamError
from . import _tensors as T


class _BucketStream:
    """The gradient stream of one DDP bucket and the layout it was opened for."""

    def __init__(self, layout, stream, keys, sizes):
        self.layout = layout
        self.stream = stream
        self.keys = keys      # parameter keys in bucket order
        self.sizes = sizes    # their element counts
        self.in_flight = False


class GradstreamState:
    """State of the gradstream DDP comm hook.

    codec: "raw", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int4", "topk:<fraction>" (with
        options as GS_CODEC takes them, e.g. "int4,sr"), or "auto": the adaptive controller
        picks each link's codec from a ladder (a communicator of the state's own, made with
        codec="auto" and the options below, e.g. codec_ladder="raw,bf16,int8").
    error_feedback: keep what the codec dropped and add it to the next iteration's gradient.
    process_group: a gradstream group (None: the default group).
    model: optional module whose named_parameters() name the residuals in state_dict().
    bucket_bytes: gradstream's reduction granularity inside a DDP bucket (None: 4 MiB).
    communicator options (codec "auto"): gs_config_t fields such as codec_ladder, codec_floor,
        error_budget, chunk_min_bytes, chunk_max_bytes.
    """

    def __init__(self, codec="int8", error_feedback=True, process_group=None, model=None,
                 bucket_bytes=None, **communicator_options):
        if not isinstance(codec, str) or not codec:
            raise ValueError("gradstream: GradstreamState codec must be a codec name such as "
                             "'int8'")
        self.codec = codec
        self.error_feedback = bool(error_feedback)
        self.process_group = process_group
        self.bucket_bytes = bucket_bytes
        self._communicator_options = communicator_options
        if communicator_options and codec != "auto":
            raise ValueError("gradstream: communicator options ("
                             f"{', '.join(communicator_options)}) apply to codec='auto' only")
        self._names = ({id(p): name for name, p in model.named_parameters()}
                       if model is not None else None)
        self._keys = {}       # id(parameter) -> key
        self._params = []     # the parameters seen, kept so their ids stay theirs
        self._residuals = {}  # key -> uint8 tensor: residual bytes saved from closed streams
        self._streams = {}    # DDP bucket index -> _BucketStream
        self._comm = None
        self._lock = threading.Lock()
        self.rebinds = 0      # streams (re)opened for a new bucket layout

    # -- the communicator --------------------------------------------------------------------
    def _group(self):
        from . import _gradstream_group
        return _gradstream_group(self.process_group)

    def communicator(self):
        """The communicator the hook reduces on: the group's, or for codec "auto" one of the
        state's own (created collectively on the hook's first call)."""
        if self._comm is None:
            group = self._group()
            if self.codec == "auto":
                self._comm = group.new_communicator(codec="auto", **self._communicator_options)
            else:
                self._comm = group.communicator
        return self._comm

    def stats(self):
        """gs_comm_stats of the hook's communicator (see gradstream.torch.stats)."""
        return self.communicator().stats()

    # -- residual bookkeeping ----------------------------------------------------------------
    def _key(self, p):
        key = self._keys.get(id(p))
        if key is None:
            if self._names is not None and id(p) in self._names:
                key = self._names[id(p)]
            else:
                key = len(self._params)
            self._keys[id(p)] = key
            self._params.append(p)
        return key

    def _save(self, entry):
        """Copies entry's residual into the per-parameter store."""
        nbytes = entry.stream.residual_bytes()
        if nbytes == 0:
            return
        raw = torch.empty(nbytes, dtype=torch.uint8)
        entry.stream.save_residual(raw.data_ptr(), nbytes)
        per = nbytes // sum(entry.sizes)
        offset = 0
        for key, n in zip(entry.keys, entry.sizes):
            self._residuals[key] = raw[offset:offset + n * per].clone()
            offset += n * per

    def _load(self, entry):
        nbytes = entry.stream.residual_bytes()
        if nbytes == 0 or not any(k in self._residuals for k in entry.keys):
            return
        per = nbytes // sum(entry.sizes)
        raw = torch.zeros(nbytes, dtype=torch.uint8)
        offset = 0
        for key, n in zip(entry.keys, entry.sizes):
            saved = self._residuals.get(key)
            if saved is not None:
                if saved.numel() != n * per:
                    raise ValueError(f"gradstream: saved residual of parameter {key!r} has "
                                     f"{saved.numel()} bytes, the parameter needs {n * per}")
                raw[offset:offset + n * per] = saved
            offset += n * per
        entry.stream.load_residual(raw.data_ptr(), nbytes)

    def _retire(self, index, keys):
        """Saves and closes the stream of bucket `index` and every stream holding one of `keys`
        (DDP moved those parameters into another bucket)."""
        for i, entry in list(self._streams.items()):
            if i != index and keys.isdisjoint(entry.keys):
                continue
            if entry.in_flight:
                raise RuntimeError(f"gradstream: DDP bucket {index} claims parameters that bucket "
                                   f"{i} is reducing now")
            self._save(entry)
            entry.stream.close()
            del self._streams[i]

    def _stream_for(self, bucket, buf):
        params = list(bucket.parameters())
        stream = T.cuda_stream(buf.device)
        layout = (buf.data_ptr(), buf.numel(), buf.dtype, tuple(id(p) for p in params), stream)
        entry = self._streams.get(bucket.index())
        if entry is not None and entry.layout == layout:
            return entry
        T.check_tensor(buf, "DDP bucket buffer")
        sizes = [p.numel() for p in params]
        if sum(sizes) != buf.numel():
            raise ValueError(f"gradstream: DDP bucket {bucket.index()} holds {buf.numel()} "
                             f"elements but its parameters {sum(sizes)}")
        # A new layout: DDP rebuilt its buckets (or this is the first iteration).
        keys = [self._key(p) for p in params]
        self._retire(bucket.index(), set(keys))
        comm = self.communicator()
        codec = None if self.codec == "auto" else self.codec
        new = _comm.GradientStream(comm, buf.data_ptr(), buf.numel(), T.gs_dtype(buf, "bucket"),
                                   _lib.OPS["avg"], codec=codec,
                                   error_feedback=self.error_feedback and buf.is_floating_point(),
                                   bucket_bytes=self.bucket_bytes, stream=stream)
        entry = _BucketStream(layout, new, keys, sizes)
        self._load(entry)
        self._streams[bucket.index()] = entry
        self.rebinds += 1
        return entry

    def _reduce(self, bucket):
        buf = bucket.buffer()
        with self._lock:
            entry = self._stream_for(bucket, buf)
            future = T.new_future(buf.device)

            def done(status, message):
                entry.in_flight = False
                if status != _lib.GS_OK:
                    future.set_exception(GradstreamError(status, message, "comm_hook allreduce"))
                else:
                    future.set_result(buf)

            entry.in_flight = True
            try:
                entry.stream.reduce(done)
            except Exception:
                entry.in_flight = False
                raise
            return future

    # -- checkpoints -------------------------------------------------------------------------
    def _check_idle(self, what):
        busy = [i for i, e in self._streams.items() if e.in_flight]
        if busy:
            raise RuntimeError(f"gradstream: {what} while buckets {busy} are being reduced "
                               "(call it between iterations)")

    def state_dict(self):
        """The residuals per parameter (opaque bytes, as uint8 tensors) and the settings."""
        with self._lock:
            self._check_idle("state_dict()")
            for entry in self._streams.values():
                self._save(entry)
            return {"codec": self.codec, "error_feedback": self.error_feedback,
                    "residuals": {k: v.clone() for k, v in self._residuals.items()}}

    def load_state_dict(self, state):
        """Restores residuals saved by state_dict(); the streams load them on their next use."""
        with self._lock:
            self._check_idle("load_state_dict()")
            if state.get("codec") != self.codec:
                raise ValueError(f"gradstream: the state was saved with codec "
                                 f"{state.get('codec')!r}, this one uses {self.codec!r}")
            for entry in self._streams.values():
                entry.stream.close()
            self._streams.clear()
            self._residuals = {k: v.clone() for k, v in state["residuals"].items()}

    def close(self):
        """Closes the streams (and the state's own communicator for codec "auto")."""
        with self._lock:
            for entry in self._streams.values():
                entry.stream.close()
            self._streams.clear()
            if self._comm is not None and self.codec == "auto":
                self._comm.destroy()
            self._comm = None


def comm_hook(state, bucket):
    """DDP comm hook: averages the bucket with state's codec (and error feedback) over
    gradstream; the returned future completes on the communicator's progress thread."""
    return state._reduce(bucket)
