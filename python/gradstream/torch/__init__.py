"""gradstream for PyTorch: the torch.distributed backend "gradstream" and DDP comm hooks.

    import torch.distributed as dist
    import gradstream.torch                  # registers the backend "gradstream"
    dist.init_process_group("gradstream")    # env:// (RANK, WORLD_SIZE, MASTER_ADDR/PORT) or torchrun

    from gradstream.torch import GradstreamState, comm_hook
    ddp.register_comm_hook(GradstreamState(codec="int8", error_feedback=True), comm_hook)
"""
import torch.distributed as _dist

from ._backend import ProcessGroupGradstream, register
from ._hooks import GradstreamState, comm_hook

register()


def _gradstream_group(group):
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupGradstream):
        raise TypeError(f"gradstream: the group is a {type(pg).__name__}, not a gradstream "
                        "process group (create it with backend='gradstream')")
    return pg


def stats(group=None):
    """The group's communicator figures (gs_comm_stats) as a dict: collectives, errors,
    bytes_logical (element bytes this rank sent before encoding), bytes_wire (what it put on the
    wire), compression_ratio, last_algorithm, transport, last_busbw, ... group=None: the default
    group."""
    return _gradstream_group(group).stats()


__all__ = ["ProcessGroupGradstream", "GradstreamState", "comm_hook", "stats"]
