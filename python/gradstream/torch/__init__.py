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


class Registration:
    """A tensor's memory registered with a gradstream group's communicator (register_tensor);
    deregister() or leaving the `with` block drops it. The tensor must stay alive until then."""

    def __init__(self, pg, tensor):
        self._comm = pg.communicator
        self._tensor = tensor  # kept alive while registered
        self._handle = self._comm.register(tensor.data_ptr(),
                                           tensor.numel() * tensor.element_size())

    def deregister(self):
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._comm.deregister(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.deregister()


def register_tensor(tensor, group=None):
    """Registers a contiguous CPU tensor's memory with the group's communicator
    (gs_comm_register, NCCL's ncclCommRegister): collectives on it keep their transport
    registrations across calls instead of registering at each (verbs pins pages at every
    registration). Training loops that reuse gradient buckets register them once. Returns a
    Registration (a context manager)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"gradstream: register_tensor needs a tensor, not {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("gradstream: register_tensor: the tensor is not contiguous (register "
                         "the contiguous storage the collectives run on)")
    if tensor.device.type != "cpu":
        raise ValueError(f"gradstream: register_tensor: the tensor is on {tensor.device}; only "
                         "host memory is registered in this version")
    return Registration(_gradstream_group(group), tensor)


__all__ = ["ProcessGroupGradstream", "GradstreamState", "comm_hook", "stats", "register_tensor",
           "Registration"]
