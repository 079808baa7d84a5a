"""ctypes binding of libgradstream's C API (include/gradstream/gradstream.h).

Only this module knows the C signatures and struct layouts; tests/python/test_abi.py checks
the layouts against the header's offsetof/sizeof, compiled by the build.
"""
import ctypes
import os
import pathlib

c_status = ctypes.c_int
c_comm = ctypes.c_void_p
c_request = ctypes.c_void_p
c_stream = ctypes.c_void_p
c_ptr = ctypes.c_void_p
c_size = ctypes.c_size_t

GS_OK = 0
GS_IN_PROGRESS = 1
STATUS_NAMES = {
    0: "GS_OK",
    1: "GS_IN_PROGRESS",
    -1: "GS_ERR_INVALID_ARGUMENT",
    -2: "GS_ERR_UNSUPPORTED",
    -3: "GS_ERR_NO_MEMORY",
    -4: "GS_ERR_SYSTEM",
    -5: "GS_ERR_REMOTE",
    -6: "GS_ERR_TIMEOUT",
    -7: "GS_ERR_ABORTED",
    -8: "GS_ERR_INTERNAL",
}

# gs_dtype_t and gs_redop_t
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int32": 4, "int64": 5,
          "uint8": 6}
OPS = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}

UNIQUE_ID_BYTES = 128


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """gs_config_t: versioned, fields only ever appended."""
    _fields_ = [
        ("struct_size", c_size),
        ("transport", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int64),
        ("chunk_bytes", ctypes.c_int64),
        ("codec", ctypes.c_char_p),
        ("metrics_address", ctypes.c_char_p),
        ("slots_per_peer", ctypes.c_int64),
        ("sockets_per_peer", ctypes.c_int64),
        ("codec_ladder", ctypes.c_char_p),
        ("codec_floor", ctypes.c_char_p),
        ("chunk_min_bytes", ctypes.c_int64),
        ("chunk_max_bytes", ctypes.c_int64),
        ("error_budget", ctypes.c_double),
        ("algo", ctypes.c_char_p),
        ("hostname", ctypes.c_char_p),
        ("shm", ctypes.c_int64),
        ("staging_bytes", ctypes.c_int64),
    ]


class CommStats(ctypes.Structure):
    """gs_comm_stats_t."""
    _fields_ = [
        ("struct_size", c_size),
        ("collectives", ctypes.c_uint64),
        ("errors", ctypes.c_uint64),
        ("bytes_logical", ctypes.c_uint64),
        ("bytes_wire", ctypes.c_uint64),
        ("chunks_sent", ctypes.c_uint64),
        ("chunks_received", ctypes.c_uint64),
        ("compression_ratio", ctypes.c_double),
        ("credit_wait_seconds", ctypes.c_double),
        ("chunk_latency_p50_seconds", ctypes.c_double),
        ("chunk_latency_p99_seconds", ctypes.c_double),
        ("last_seconds", ctypes.c_double),
        ("last_algbw", ctypes.c_double),
        ("last_busbw", ctypes.c_double),
        ("metrics_address", ctypes.c_char * 64),
        ("last_algorithm", ctypes.c_char * 32),
        ("transport", ctypes.c_char * 32),
        ("device_path", ctypes.c_char * 32),
        ("staged_collectives", ctypes.c_uint64),
        ("staged_to_host_bytes", ctypes.c_uint64),
        ("staged_to_device_bytes", ctypes.c_uint64),
        ("buffer_registrations", ctypes.c_uint64),
        ("buffer_registered_bytes", ctypes.c_uint64),
        ("single_copy_bytes", ctypes.c_uint64),
    ]


class StreamConfig(ctypes.Structure):
    """gs_stream_config_t."""
    _fields_ = [
        ("struct_size", c_size),
        ("bucket_bytes", ctypes.c_int64),
        ("error_feedback", ctypes.c_int),
        ("codec", ctypes.c_char_p),
        ("cuda_stream", c_stream),
    ]


# void (*gs_completion_fn)(gs_status_t status, const char* message, void* user_data)
COMPLETION_FN = ctypes.CFUNCTYPE(None, c_status, ctypes.c_char_p, c_ptr)

_PROTOTYPES = {
    "gs_config_init": [ctypes.POINTER(Config)],
    "gs_last_error": [],
    "gs_version_string": [],
    "gs_get_unique_id": [ctypes.POINTER(UniqueId)],
    "gs_comm_init_rank_version": [ctypes.POINTER(c_comm), ctypes.c_int, ctypes.POINTER(UniqueId),
                                  ctypes.c_int, ctypes.POINTER(Config), ctypes.c_int],
    "gs_comm_rank": [c_comm, ctypes.POINTER(ctypes.c_int)],
    "gs_comm_size": [c_comm, ctypes.POINTER(ctypes.c_int)],
    "gs_comm_split": [c_comm, ctypes.c_int, ctypes.c_int, ctypes.POINTER(Config),
                      ctypes.POINTER(c_comm)],
    "gs_comm_abort": [c_comm],
    "gs_comm_destroy": [c_comm],
    "gs_comm_stats": [c_comm, ctypes.POINTER(CommStats)],
    "gs_allreduce": [c_ptr, c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream],
    "gs_iallreduce": [c_ptr, c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream,
                      ctypes.POINTER(c_request)],
    "gs_ireduce_scatter": [c_ptr, c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream,
                           ctypes.POINTER(c_request)],
    "gs_iallgather": [c_ptr, c_ptr, c_size, ctypes.c_int, c_comm, c_stream,
                      ctypes.POINTER(c_request)],
    "gs_ibroadcast": [c_ptr, c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream,
                      ctypes.POINTER(c_request)],
    "gs_ireduce": [c_ptr, c_ptr, c_size, ctypes.c_int, ctypes.c_int, ctypes.c_int, c_comm,
                   c_stream, ctypes.POINTER(c_request)],
    "gs_ialltoall": [c_ptr, c_ptr, c_size, ctypes.c_int, c_comm, c_stream,
                     ctypes.POINTER(c_request)],
    "gs_ialltoallv": [c_ptr, ctypes.POINTER(c_size), ctypes.POINTER(c_size), c_ptr,
                      ctypes.POINTER(c_size), ctypes.POINTER(c_size), ctypes.c_int, c_comm,
                      c_stream, ctypes.POINTER(c_request)],
    "gs_send": [c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream],
    "gs_recv": [c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream],
    "gs_isend": [c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream,
                 ctypes.POINTER(c_request)],
    "gs_irecv": [c_ptr, c_size, ctypes.c_int, ctypes.c_int, c_comm, c_stream,
                 ctypes.POINTER(c_request)],
    "gs_barrier": [c_comm],
    "gs_request_on_complete": [c_request, COMPLETION_FN, c_ptr],
    "gs_test": [c_request, ctypes.POINTER(ctypes.c_int)],
    "gs_wait": [c_request, ctypes.c_int],
    "gs_comm_register": [c_comm, c_ptr, c_size, ctypes.POINTER(c_ptr)],
    "gs_comm_deregister": [c_comm, c_ptr],
    "gs_request_free": [c_request],
    "gs_stream_config_init": [ctypes.POINTER(StreamConfig)],
    "gs_stream_open": [c_comm, c_ptr, c_size, ctypes.c_int, ctypes.c_int,
                       ctypes.POINTER(StreamConfig), ctypes.POINTER(c_ptr)],
    "gs_stream_begin": [c_ptr],
    "gs_stream_ready": [c_ptr, c_size, c_size],
    "gs_stream_wait": [c_ptr, ctypes.c_int],
    "gs_stream_on_complete": [c_ptr, COMPLETION_FN, c_ptr],
    "gs_stream_close": [c_ptr],
    "gs_stream_residual_bytes": [c_ptr, ctypes.POINTER(c_size)],
    "gs_stream_save_residual": [c_ptr, c_ptr, c_size],
    "gs_stream_load_residual": [c_ptr, c_ptr, c_size],
}

# The header's GS_API_VERSION this binding was written against (major must match the library).
API_VERSION = 100


def _candidates():
    """Where libgradstream is looked for, first match wins."""
    env = os.environ.get("GRADSTREAM_LIBRARY")
    if env:
        yield env  # explicit path: an error if it does not load
        return
    here = pathlib.Path(__file__).resolve().parent
    for name in ("libgradstream.so.0", "libgradstream.so"):
        local = here / "_native" / name  # the build tree's package, or a wheel that bundles it
        if local.exists():
            yield str(local)
    yield "libgradstream.so.0"  # the dynamic loader's path: an installed prefix, LD_LIBRARY_PATH


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError(
        "gradstream: cannot load libgradstream (" + "; ".join(tried) + "). Build it "
        "(scripts/build.sh) and use build/python, install it (cmake --install build), or set "
        "GRADSTREAM_LIBRARY to the library's path.")


lib, library_path = _load()
for _name, _args in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.argtypes = _args
    _fn.restype = c_status
lib.gs_last_error.restype = ctypes.c_char_p
lib.gs_version_string.restype = ctypes.c_char_p


def last_error():
    return lib.gs_last_error().decode(errors="replace")
