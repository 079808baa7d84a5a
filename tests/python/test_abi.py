"""The ctypes mirrors of the C structs (gradstream/_lib.py) have the header's layout: every
field at the C offset, the same sizes, the same API version, and every exported gs_* function
the binding calls exists."""
import json
import os
import subprocess

from conftest import BUILD

from gradstream import _lib


def c_layout():
    exe = BUILD / "tests" / "python" / "gs_abi_layout"
    return json.loads(subprocess.run([str(exe)], check=True, capture_output=True,
                                     text=True).stdout)


def test_struct_layouts_match_the_header():
    layout = c_layout()
    for name, cls in (("gs_config_t", _lib.Config), ("gs_comm_stats_t", _lib.CommStats),
                      ("gs_stream_config_t", _lib.StreamConfig), ("gs_unique_id_t", _lib.UniqueId)):
        c = layout[name]
        assert c.pop("size") == __import__("ctypes").sizeof(cls), name
        py = {f: getattr(cls, f).offset for f, _ in cls._fields_}
        if name != "gs_unique_id_t":
            assert py == c, f"{name}: python {py} vs C {c}"
    assert layout["api_version"]["size"] == _lib.API_VERSION


def test_the_library_loaded_is_the_build_trees():
    assert os.path.realpath(_lib.library_path).startswith(os.path.realpath(BUILD / "python"))
