"""gradstream: gradient streaming and reduction between processes (Python binding).

``gradstream.torch`` is the torch.distributed backend and the DDP communication hooks; this
package itself is the thin ctypes layer over libgradstream's C API that it is built on.
"""
from . import _lib
from ._comm import Communicator, GradientStream, unique_id
from .errors import GradstreamError

__version__ = _lib.lib.gs_version_string().decode()
library_path = _lib.library_path
DTYPES = dict(_lib.DTYPES)
OPS = dict(_lib.OPS)

__all__ = ["Communicator", "GradientStream", "GradstreamError", "unique_id", "library_path",
           "DTYPES", "OPS", "__version__"]
