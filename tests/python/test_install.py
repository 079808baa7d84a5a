"""`pip install ./python` installs a package that finds its library without the build tree on
any path: it bundles libgradstream, imports, registers the backend and reduces across ranks."""
import os
import subprocess
import sys

from conftest import BUILD, ROOT, launch


def test_pip_install_bundles_the_library_and_runs(tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ, GRADSTREAM_LIB_DIR=str(BUILD / "capi"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(ROOT / "python")],
                   check=True, env=env, cwd=tmp_path, timeout=300)
    bundled = target / "gradstream" / "_native" / "libgradstream.so.0"
    assert bundled.exists()
    probe = subprocess.run(
        [sys.executable, "-c", "import gradstream, gradstream.torch, torch.distributed as d; "
         "print(gradstream.library_path); print('gradstream' in d.Backend.backend_list)"],
        env=dict(os.environ, PYTHONPATH=str(target)), capture_output=True, text=True,
        cwd=tmp_path, check=True)
    path, registered = probe.stdout.split()
    assert os.path.realpath(path) == os.path.realpath(bundled)
    assert registered == "True"
    out = launch(2, "collectives", tmp_path=tmp_path, env={"PYTHONPATH": str(target)})
    out.check()
