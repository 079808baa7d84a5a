"""The exception every gradstream failure raises."""
from . import _lib


class GradstreamError(RuntimeError):
    """A gs_* call failed. ``status`` is the gs_status_t name (e.g. "GS_ERR_REMOTE"), the
    message is the library's gs_last_error(): it names the argument or peer at fault."""

    def __init__(self, status, message, call=""):
        self.status = _lib.STATUS_NAMES.get(status, str(status))
        self.code = status
        prefix = f"gradstream: {call} failed" if call else "gradstream"
        super().__init__(f"{prefix} ({self.status}): {message}")


def check(status, call):
    """Raises GradstreamError for a failed gs_* status (read gs_last_error on this thread)."""
    if status != _lib.GS_OK:
        raise GradstreamError(status, _lib.last_error(), call)
