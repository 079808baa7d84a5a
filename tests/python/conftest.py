"""Multi-process harness: every test runs its scenario in N real processes (workers.py), which
rendezvous through torch's TCPStore on 127.0.0.1 as under torchrun (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), each bounded by a timeout."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = pathlib.Path(os.environ.get("GS_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(BUILD / "python"))  # the staged package, for tests importing it here


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """The outcome of one launch: per rank exit code, output and the JSON it reported."""

    def __init__(self, procs, outputs, results, seconds):
        self.codes = [p.returncode for p in procs]
        self.outputs = outputs
        self.results = results
        self.seconds = seconds

    def check(self):
        for r, code in enumerate(self.codes):
            assert code == 0, f"rank {r} exited {code}:\n{self.outputs[r][-6000:]}"
        return self


def launch(n, scenario, *args, timeout=120, env=None, tmp_path=None):
    """Runs workers.py SCENARIO ARGS... as ranks 0..n-1; kills every rank past timeout."""
    port = free_port()
    out_dir = pathlib.Path(tmp_path) if tmp_path else pathlib.Path(os.environ.get("TMPDIR", "/tmp"))
    procs, files = [], []
    base = dict(os.environ)
    base.update({"PYTHONPATH": str(BUILD / "python"), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "WORLD_SIZE": str(n), "OMP_NUM_THREADS": "1",
                 "PYTHONUNBUFFERED": "1"})
    base.update(env or {})
    start = time.monotonic()
    for r in range(n):
        e = dict(base, RANK=str(r), LOCAL_RANK=str(r))
        result = out_dir / f"{scenario}-{port}-rank{r}.json"
        e["GS_TEST_RESULT"] = str(result)
        log = open(out_dir / f"{scenario}-{port}-rank{r}.log", "w+")
        files.append((log, result))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "workers.py"), scenario,
                                       *map(str, args)], env=e, stdout=log,
                                      stderr=subprocess.STDOUT))
    deadline = start + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            for q in procs:
                q.wait()
            outputs = [open(f.name).read() for f, _ in files]
            pytest.fail(f"{scenario}: ranks still running after {timeout} s (a hang):\n" +
                        "\n".join(f"--- rank {r}\n{o[-3000:]}" for r, o in enumerate(outputs)))
    seconds = time.monotonic() - start
    outputs, results = [], []
    for log, result in files:
        log.seek(0)
        outputs.append(log.read())
        log.close()
        results.append(json.loads(result.read_text()) if result.exists() else None)
    return Ranks(procs, outputs, results, seconds)


@pytest.fixture
def ranks(tmp_path):
    def run(n, scenario, *args, **kwargs):
        return launch(n, scenario, *args, tmp_path=tmp_path, **kwargs)
    return run
