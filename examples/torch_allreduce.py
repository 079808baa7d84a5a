"""Minimal torch.distributed job on the gradstream backend; run it under torchrun:

    PYTHONPATH=build/python python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        examples/torch_allreduce.py

Each rank allreduces a 16 MiB float32 tensor a few times, checks the sum and prints the
communicator's transport, busbw and wire bytes.
"""
import time

import torch
import torch.distributed as dist

import gradstream.torch  # registers the backend "gradstream"


def main():
    dist.init_process_group("gradstream")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.empty(4 << 20)
    seconds = []
    for _ in range(5):
        t.fill_(rank + 1)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        seconds.append(time.perf_counter() - start)
        assert torch.all(t == world * (world + 1) / 2), "wrong sum"
    st = gradstream.torch.stats()
    if rank == 0:
        best = min(seconds)
        busbw = t.numel() * 4 / best * 2 * (world - 1) / world / 1e9
        print(f"gradstream backend, {world} ranks, 16 MiB float32 allreduce: {best * 1e3:.2f} ms, "
              f"busbw {busbw:.2f} GB/s, links over {st['transport']}, "
              f"{st['bytes_wire'] / 2**20:.1f} MiB on the wire; results checked")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
