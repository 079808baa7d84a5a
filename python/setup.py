"""Installs the gradstream package and bundles libgradstream into gradstream/_native/.

The library is taken from GRADSTREAM_LIB_DIR, else from the build tree next to this directory
(../build/capi after scripts/build.sh). Without either, nothing is bundled and the package loads
libgradstream.so.0 through the dynamic loader at import (an installed prefix, LD_LIBRARY_PATH)."""
import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def find_library():
    dirs = []
    if os.environ.get("GRADSTREAM_LIB_DIR"):
        dirs.append(pathlib.Path(os.environ["GRADSTREAM_LIB_DIR"]))
    dirs.append(HERE.parent / "build" / "capi")
    for d in dirs:
        lib = d / "libgradstream.so.0"
        if lib.exists():
            return lib.resolve()
    return None


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is None:
            print("gradstream: no libgradstream found to bundle (set GRADSTREAM_LIB_DIR); the "
                  "package will load libgradstream.so.0 from the system at import")
            return
        target = pathlib.Path(self.build_lib) / "gradstream" / "_native"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, target / "libgradstream.so.0")
        print(f"gradstream: bundled {lib}")


setup(cmdclass={"build_py": BuildWithLibrary})
