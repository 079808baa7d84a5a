"""What the torch benchmarks share: the process group under test, and a gloo side group that
carries their barriers and the max over ranks, so the group being measured carries only the
timed calls."""
import datetime
import time

import torch
import torch.distributed as dist


class Job:
    def __init__(self, backend, timeout_s):
        if backend == "gradstream":
            import gradstream.torch  # noqa: F401  registers the backend
        timeout = datetime.timedelta(seconds=timeout_s)
        start = time.perf_counter()
        dist.init_process_group(backend, timeout=timeout)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.side = dist.new_group(backend="gloo", timeout=timeout)
        self.init_seconds = time.perf_counter() - start

    def out(self, *args):
        if self.rank == 0:
            print(*args, flush=True)

    def max_over_ranks(self, values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.side)
        return t.tolist()
