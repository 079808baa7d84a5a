"""ProcessGroupGradstream: the torch.distributed backend "gradstream".

A Python ProcessGroup (torch 2.x calls its methods for every collective) over one gradstream
communicator per group. Each call validates its tensors, queues non-blocking gradstream requests
and returns a Work whose future the communicator's progress thread completes: DDP and
``async_op=True`` callers never need to call wait() for the work to finish. Allreduces of small
host tensors (at most INLINE_MAX_BYTES) run the blocking call instead and return completed.
"""
import datetime
import threading

import torch
import torch.distributed as dist

from .. import _comm
from ..errors import GradstreamError
from . import _tensors as T

# Host allreduces of at most this many bytes run inline (ProcessGroupGradstream.allreduce).
INLINE_MAX_BYTES = 16384


class _Completion:
    """Completes a future once `count` requests finished: the first error, or the result after
    the write-backs (copies of staged results into non-contiguous or list outputs) ran."""

    def __init__(self, future, result, count, what, finish=()):
        self._future = future
        self._result = result
        self._left = count
        self._what = what
        self._finish = list(finish)
        self._error = None
        self._lock = threading.Lock()
        self._held = []

    def hold(self, *tensors):
        """Keeps staging tensors alive until the requests reading them completed."""
        self._held.extend(tensors)

    def __call__(self, status, message):
        with self._lock:
            if status != 0 and self._error is None:
                self._error = GradstreamError(status, message, self._what)
            self._left -= 1
            if self._left > 0:
                return
        if self._error is not None:
            self._future.set_exception(self._error)
            return
        try:
            for fn in self._finish:
                fn()
        except Exception as e:  # a write-back failed: report it on the future
            self._future.set_exception(e)
            return
        self._future.set_result(self._result)


class _Work(dist.Work):
    """The Work of every op: its future, which the progress thread completes. wait() raises the
    requests' failure, which the Work of torch's _create_work_from_future does not (torch 2.13:
    its wait() returns True over a future holding an exception), so dist.send / recv and
    async_op callers that wait() would miss it. The timeout is the communicator's: every
    request completes, failed if need be, within it."""

    def __init__(self, future):
        super().__init__()
        self._future = future

    def wait(self, timeout=None):
        self._future.wait()  # raises the future's exception
        return True

    def get_future(self):
        return self._future

    def is_completed(self):
        return self._future.done()

    def result(self):
        return self._future.value()


def _timeout_ms(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return max(1, int(timeout.total_seconds() * 1000))
    return int(timeout)


class ProcessGroupGradstream(dist.ProcessGroup):
    """One rank of a torch.distributed group backed by a gradstream communicator.

    Made by ``dist.init_process_group("gradstream")`` and ``dist.new_group(backend=
    "gradstream")`` (the backend creator below). The rendezvous goes through the group's Store:
    rank 0 publishes a unique id under ``gradstream/unique_id/<n>``. The group's timeout is the
    communicator's (GS_TIMEOUT_MS, when set, wins, as every GS_* variable does).
    """

    def __init__(self, store, rank, size, timeout=None, **options):
        super().__init__(rank, size)
        self._store = store
        self._group_rank = rank
        self._group_size = size
        self._timeout_ms = _timeout_ms(timeout)
        self._options = options
        self._communicators = 0
        self._comm = self.new_communicator()

    # -- identity --------------------------------------------------------------------------
    def getBackendName(self):
        return "gradstream"

    def __repr__(self):
        return f"ProcessGroupGradstream(rank={self._group_rank}, size={self._group_size})"

    @property
    def communicator(self):
        """The gradstream.Communicator of this group."""
        return self._comm

    def new_communicator(self, **options):
        """Another communicator over the same ranks (collective: every rank calls it in the same
        order), e.g. one with codec="auto" for a comm hook. Options as gs_config_t's fields."""
        merged = dict(self._options)
        merged.setdefault("timeout_ms", self._timeout_ms)
        merged.update(options)
        key = f"gradstream/unique_id/{self._communicators}"
        self._communicators += 1
        return _comm.Communicator.from_store(self._store, self._group_rank, self._group_size,
                                             key=key, **merged)

    def stats(self):
        return self._comm.stats()

    def shutdown(self):
        self._comm.destroy()

    def abort(self):
        try:
            self._comm.abort()
        finally:
            self._comm.destroy()

    # -- helpers -----------------------------------------------------------------------------
    def _begin(self, tensors, what):
        for i, t in enumerate(tensors):
            T.check_tensor(t, f"{what}[{i}]" if len(tensors) > 1 else what)
        device = T.same_device(tensors, what)
        return device, T.cuda_stream(device)

    @staticmethod
    def _work(future):
        return _Work(future)

    # -- collectives -------------------------------------------------------------------------
    def _in_place_each(self, what, tensors, issue):
        """One in-place request per tensor (a non-contiguous one through a staged copy):
        issue(address, count, dtype, done, stream)."""
        device, stream = self._begin(tensors, f"{what} tensor")
        future = T.new_future(device)
        staged = [T.contiguous(t) for t in tensors]
        done = _Completion(future, tensors, len(tensors), what,
                           [wb for _, wb in staged if wb is not None])
        for buf, _ in staged:
            issue(buf.data_ptr(), buf.numel(), T.gs_dtype(buf, f"{what} tensor"), done, stream)
        return self._work(future)

    def allreduce(self, tensors, opts=None):
        op = _op(opts)
        # Host tensors of up to INLINE_MAX_BYTES (loss scalars, grad norms, metrics) run the
        # blocking call on this thread: 8 B took ~100 us per call through a request and its
        # completion callback, against 0.3 us for the call itself over shm.
        return self._in_place_each(
            "allreduce", tensors,
            lambda p, n, dtype, done, stream: self._comm.allreduce(
                p, p, n, dtype, op, done, stream,
                inline=stream is None and n * T.ELEMENT_BYTES[dtype] <= INLINE_MAX_BYTES))

    def allreduce_coalesced(self, tensors, opts=None):
        """One request over the tensors flattened (per dtype), results copied back."""
        op = _op(opts)
        device, stream = self._begin(tensors, "allreduce_coalesced tensor")
        future = T.new_future(device)
        groups = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        flats, finish = [], []  # the flats are held by the write-backs
        for same in groups.values():
            flat = torch.cat([t.reshape(-1) for t in same])
            flats.append(flat)

            def write_back(same=same, flat=flat):
                offset = 0
                for t in same:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
            finish.append(write_back)
        done = _Completion(future, tensors, len(flats), "allreduce_coalesced", finish)
        for flat in flats:
            self._comm.allreduce(flat.data_ptr(), flat.data_ptr(), flat.numel(),
                                 T.gs_dtype(flat, "tensor"), op, done, stream)
        return self._work(future)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        if opts is not None and opts.rootTensor != 0:
            raise ValueError(f"gradstream: broadcast rootTensor {opts.rootTensor} is not "
                             "supported (one tensor per rank)")
        self._check_rank(root, "broadcast root")
        return self._in_place_each(
            "broadcast", tensors,
            lambda p, n, dtype, done, stream: self._comm.broadcast(p, p, n, dtype, root, done,
                                                                   stream))

    def _gather_into(self, output, input, what, done, stream):
        """allgather of input into the flat output (numel = size x input's)."""
        self._check_block(output, input, "output", "input", what)
        send = input.contiguous()
        done.hold(send)
        self._comm.allgather(send.data_ptr(), output.data_ptr(), send.numel(),
                             T.gs_dtype(send, f"{what} input"), done, stream)

    def _tensor_form(self, what, output, input, issue):
        """all_gather_into_tensor / reduce_scatter_tensor: one request from input into output
        (through a contiguous copy of the output where it is not contiguous)."""
        device, stream = self._begin([output, input], f"{what} tensors")
        future = T.new_future(device)
        out, write_back = T.contiguous(output)
        done = _Completion(future, [output], 1, what, [write_back] if write_back else [])
        issue(out, input, what, done, stream)
        return self._work(future)

    def _check_rank_lists(self, what, lists, singles, list_role, single_role):
        """The list forms: one tensor per rank in each list, each like its single tensor."""
        if len(lists) != len(singles):
            raise ValueError(f"gradstream: {what} got {len(lists)} {list_role} lists for "
                             f"{len(singles)} {single_role}s")
        for i, (tensors, one) in enumerate(zip(lists, singles)):
            if len(tensors) != self._group_size:
                raise ValueError(f"gradstream: {what} {list_role} list {i} has {len(tensors)} "
                                 f"tensors; the group has {self._group_size} ranks")
            for j, t in enumerate(tensors):
                if t.numel() != one.numel() or t.dtype != one.dtype:
                    raise ValueError(f"gradstream: {what} {list_role} [{i}][{j}] is "
                                     f"{t.numel()} x {t.dtype}, {single_role} {i} is "
                                     f"{one.numel()} x {one.dtype}")

    def all_gather_single(self, output, input, opts=None):
        return self._tensor_form("all_gather_into_tensor", output, input, self._gather_into)

    _allgather_base = all_gather_single

    def allgather(self, output_lists, inputs, opts=None):
        self._check_rank_lists("allgather", output_lists, inputs, "output", "input")
        flat_outputs = [t for outs in output_lists for t in outs]
        device, stream = self._begin(list(inputs) + flat_outputs, "allgather tensors")
        future = T.new_future(device)
        stagings, finish = [], []
        for outs, inp in zip(output_lists, inputs):
            staging = torch.empty(self._group_size * inp.numel(), dtype=inp.dtype,
                                  device=inp.device)
            stagings.append(staging)

            def write_back(outs=outs, staging=staging, n=inp.numel()):
                for j, o in enumerate(outs):
                    o.copy_(staging[j * n:(j + 1) * n].view_as(o))
            finish.append(write_back)
        done = _Completion(future, output_lists, len(inputs), "allgather", finish)
        for staging, inp in zip(stagings, inputs):
            self._gather_into(staging, inp, "allgather", done, stream)
        return self._work(future)

    def _scatter_reduce(self, output, input, what, done, stream, op):
        self._check_block(input, output, "input", "output", what)
        send = input.contiguous()
        done.hold(send)
        self._comm.reduce_scatter(send.data_ptr(), output.data_ptr(), output.numel(),
                                  T.gs_dtype(send, f"{what} input"), op, done, stream)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _op(opts)
        return self._tensor_form("reduce_scatter_tensor", output, input,
                                 lambda *args: self._scatter_reduce(*args, op))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _op(opts)
        self._check_rank_lists("reduce_scatter", input_lists, outputs, "input", "output")
        flat_inputs = [t for ins in input_lists for t in ins]
        device, stream = self._begin(list(outputs) + flat_inputs, "reduce_scatter tensors")
        future = T.new_future(device)
        plans, finish = [], []
        for out, ins in zip(outputs, input_lists):
            buf, write_back = T.contiguous(out)
            if write_back:
                finish.append(write_back)
            plans.append((buf, torch.cat([t.reshape(-1) for t in ins])))
        done = _Completion(future, outputs, len(outputs), "reduce_scatter", finish)
        for buf, flat in plans:
            self._scatter_reduce(buf, flat, "reduce_scatter", done, stream, op)
        return self._work(future)

    def barrier(self, opts=None):
        token = torch.zeros(1, dtype=torch.uint8)
        future = torch.futures.Future()
        done = _Completion(future, [], 1, "barrier")
        done.hold(token)
        self._comm.allreduce(token.data_ptr(), token.data_ptr(), 1, T.DTYPES[torch.uint8],
                             T.OPS[dist.ReduceOp.RedOpType.MAX], done, None)
        return self._work(future)

    def reduce(self, tensors, opts=None):
        """gs_reduce per tensor, in place: the root's tensor gets the result, the others'
        stay as they were."""
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "reduce root")
        op = _op(opts)
        mine = self._group_rank == root
        return self._in_place_each(
            "reduce", tensors,
            lambda p, n, dtype, done, stream: self._comm.reduce(p, p if mine else 0, n, dtype, op,
                                                                root, done, stream))

    # Gather and scatter as point-to-point messages between the root and each other rank (what
    # torch's NCCL backend does with ncclSend / ncclRecv): the root receives or sends N-1 blocks
    # and every other rank one, where an allgather or a broadcast of the whole list would move
    # N times that through every rank. Every rank posts in call order, so the pairs match like
    # any other messages of the group (issue order, README "Point-to-point").
    def gather(self, output_lists, inputs, opts=None):
        """dist.gather: inputs[i] of every rank into output_lists[i][rank] on the root."""
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "gather root")
        what = "gather"
        if self._group_rank != root:  # torch passes [] here ([[]] under torchcomms)
            device, stream = self._begin(list(inputs), f"{what} tensor")
            future = T.new_future(device)
            done = _Completion(future, [], max(1, len(inputs)), what)
            for t in inputs:
                buf = t.contiguous()
                done.hold(buf)
                self._comm.isend(buf.data_ptr(), buf.numel(), T.gs_dtype(buf, f"{what} input"),
                                 root, done, stream)
            if not inputs:
                done(0, "")
            return self._work(future)
        self._check_rank_lists(what, output_lists, inputs, "output", "input")
        device, stream = self._begin(list(inputs) + [t for outs in output_lists for t in outs],
                                     f"{what} tensors")
        future = T.new_future(device)
        peers = [r for r in range(self._group_size) if r != root]
        staged = [[T.contiguous(outs[r]) for r in peers] for outs in output_lists]
        # The root's own blocks are copied at completion, like the write-backs: after the
        # requests queued before this one (which may still write its inputs) finished.
        own = [lambda outs=outs, inp=inp: outs[root].copy_(inp)
               for outs, inp in zip(output_lists, inputs)]
        done = _Completion(future, output_lists, max(1, len(peers) * len(inputs)), what,
                           own + [wb for row in staged for _, wb in row if wb is not None])
        for row in staged:
            for peer, (buf, _) in zip(peers, row):
                self._comm.irecv(buf.data_ptr(), buf.numel(), T.gs_dtype(buf, f"{what} output"),
                                 peer, done, stream)
        if not peers or not inputs:
            done(0, "")  # nothing travels: complete now
        return self._work(future)

    def scatter(self, outputs, input_lists, opts=None):
        """dist.scatter: the root's input_lists[0][r] into rank r's outputs[0]."""
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "scatter root")
        what = "scatter"
        if len(outputs) != 1:
            raise ValueError(f"gradstream: {what} takes one output tensor per rank")
        out = outputs[0]
        if self._group_rank != root:
            device, stream = self._begin([out], f"{what} output")
            future = T.new_future(device)
            buf, write_back = T.contiguous(out)
            done = _Completion(future, outputs, 1, what, [write_back] if write_back else [])
            self._comm.irecv(buf.data_ptr(), buf.numel(), T.gs_dtype(buf, f"{what} output"),
                             root, done, stream)
            return self._work(future)
        if len(input_lists) != 1:
            raise ValueError(f"gradstream: {what} on the root needs one input list")
        self._check_rank_lists(what, input_lists, outputs, "input", "output")
        ins = input_lists[0]
        device, stream = self._begin([out] + list(ins), f"{what} tensors")
        future = T.new_future(device)
        peers = [r for r in range(self._group_size) if r != root]
        # The root's own block at completion, after the requests queued before (see gather).
        done = _Completion(future, outputs, max(1, len(peers)), what,
                           [lambda: out.copy_(ins[root])])
        for peer in peers:
            buf = ins[peer].contiguous()
            done.hold(buf)
            self._comm.isend(buf.data_ptr(), buf.numel(), T.gs_dtype(buf, f"{what} input"), peer,
                             done, stream)
        if not peers:
            done(0, "")
        return self._work(future)

    def _alltoallv(self, what, out, inp, send_counts, recv_counts, finish, result):
        """One gs_ialltoallv from the flat input into the flat output (element counts per peer,
        blocks back to back); finish runs after it (write-backs)."""
        device, stream = self._begin([out, inp], f"{what} tensors")
        if out.dtype != inp.dtype:
            raise TypeError(f"gradstream: {what} output is {out.dtype}, input {inp.dtype}")
        future = T.new_future(device)
        send = inp.contiguous()
        recv, write_back = T.contiguous(out)
        done = _Completion(future, result, 1, what,
                           ([write_back] if write_back else []) + list(finish))
        done.hold(send, recv)
        self._comm.alltoallv(send.data_ptr(), send_counts, _displacements(send_counts),
                             recv.data_ptr(), recv_counts, _displacements(recv_counts),
                             T.gs_dtype(send, f"{what} input"), done, stream)
        return self._work(future)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          opts=None):
        """dist.all_to_all_single: equal splits (gs_alltoall) or rows per peer along dim 0
        (gs_alltoallv)."""
        n = self._group_size
        what = "all_to_all_single"
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise ValueError(f"gradstream: {what} needs input and output of one size "
                                 f"divisible by the group size {n} (input {input.numel()}, "
                                 f"output {output.numel()} elements) without split sizes")
            device, stream = self._begin([output, input], f"{what} tensors")
            if output.dtype != input.dtype:
                raise TypeError(f"gradstream: {what} output is {output.dtype}, "
                                f"input {input.dtype}")
            future = T.new_future(device)
            send = input.contiguous()
            recv, write_back = T.contiguous(output)
            done = _Completion(future, [output], 1, what, [write_back] if write_back else [])
            done.hold(send, recv)
            self._comm.alltoall(send.data_ptr(), recv.data_ptr(), send.numel() // n,
                                T.gs_dtype(send, f"{what} input"), done, stream)
            return self._work(future)
        send_counts = self._split_counts(input, input_split_sizes, "input", what)
        recv_counts = self._split_counts(output, output_split_sizes, "output", what)
        return self._alltoallv(what, output, input, send_counts, recv_counts, (), [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """dist.all_to_all: input_tensors[j] to rank j, output_tensors[i] from rank i (any
        sizes; through one flat staging buffer each way)."""
        what = "all_to_all"
        for name, lst in (("output", output_tensors), ("input", input_tensors)):
            if len(lst) != self._group_size:
                raise ValueError(f"gradstream: {what} takes {self._group_size} {name} tensors "
                                 f"(one per rank), not {len(lst)}")
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            raise TypeError(f"gradstream: {what} tensors differ in dtype: {sorted(map(str, dtypes))}")
        inp = torch.cat([t.reshape(-1) for t in input_tensors])
        out = torch.empty(sum(t.numel() for t in output_tensors), dtype=inp.dtype,
                          device=inp.device)

        def write_back():
            offset = 0
            for t in output_tensors:
                t.copy_(out[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        return self._alltoallv(what, out, inp, [t.numel() for t in input_tensors],
                               [t.numel() for t in output_tensors], [write_back],
                               list(output_tensors))

    def _split_counts(self, tensor, splits, name, what):
        """Element counts per peer of a dim-0 split (equal rows per peer when splits is empty)."""
        n = self._group_size
        rows = tensor.shape[0] if tensor.dim() > 0 else 1
        per_row = tensor.numel() // rows if rows else 0
        if not splits:
            if rows % n:
                raise ValueError(f"gradstream: {what} {name} has {rows} rows, not divisible by "
                                 f"the group size {n}")
            splits = [rows // n] * n
        if len(splits) != n or sum(splits) != rows or min(splits) < 0:
            raise ValueError(f"gradstream: {what} {name}_split_sizes {list(splits)} must be "
                             f"{n} non-negative sizes adding up to the {name}'s {rows} rows")
        return [int(k) * per_row for k in splits]

    # -- point-to-point ----------------------------------------------------------------------
    # dist.send / recv / isend / irecv reach these with the peer as a group rank, and so does
    # batch_isend_irecv (on a Python ProcessGroup it calls isend / irecv per op). Tags are
    # ignored: messages between two ranks match in posting order, as NCCL's do.
    # CUDA tensors go with the current stream, as the collectives' do (pinned host staging,
    # README "Device buffers"): a send reads what the stream's earlier work wrote, and a
    # receive's Work completes once the message is in the tensor.
    def _begin_p2p(self, tensors, peer, what):
        device, stream = self._begin(tensors, f"{what} tensor")
        self._check_rank(peer, f"{what} peer")
        if peer == self._group_rank:
            raise ValueError(f"gradstream: {what} with itself (group rank {peer}); a message "
                             "needs another rank of the group")
        return device, stream

    def send(self, tensors, dstRank, tag=0):
        """One message per tensor, in list order; the Work completes once dstRank received all
        of them (rendezvous), so the tensors may be reused then."""
        device, stream = self._begin_p2p(tensors, dstRank, "send")
        future = T.new_future(device)
        done = _Completion(future, tensors, len(tensors), "send")
        for t in tensors:
            buf = t.contiguous()
            done.hold(buf)
            self._comm.isend(buf.data_ptr(), buf.numel(), T.gs_dtype(buf, "send tensor"),
                             dstRank, done, stream)
        return self._work(future)

    def recv(self, tensors, srcRank, tag=0):
        """The next messages from srcRank into the tensors (a non-contiguous one through a
        staged copy, written back); count and dtype must be the sender's."""
        device, stream = self._begin_p2p(tensors, srcRank, "recv")
        future = T.new_future(device)
        staged = [T.contiguous(t) for t in tensors]
        done = _Completion(future, tensors, len(tensors), "recv",
                           [wb for _, wb in staged if wb is not None])
        for buf, _ in staged:
            self._comm.irecv(buf.data_ptr(), buf.numel(), T.gs_dtype(buf, "recv tensor"),
                             srcRank, done, stream)
        return self._work(future)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("gradstream backend: recv from any source is not supported: messages "
                           "are matched per sender in posting order (as NCCL's); pass src")

    # -- argument checks ---------------------------------------------------------------------
    def _check_rank(self, root, what):
        if not 0 <= root < self._group_size:
            raise ValueError(f"gradstream: {what} {root} is out of range [0, "
                             f"{self._group_size})")

    def _check_block(self, blocks, block, blocks_name, block_name, what):
        if blocks.dtype != block.dtype:
            raise TypeError(f"gradstream: {what} {blocks_name} is {blocks.dtype}, "
                            f"{block_name} {block.dtype}")
        if blocks.numel() != self._group_size * block.numel():
            raise ValueError(f"gradstream: {what} {blocks_name} has {blocks.numel()} elements; "
                             f"it must have group size {self._group_size} x {block_name}'s "
                             f"{block.numel()}")


def _displacements(counts):
    """Blocks back to back: the running sum of the counts before each."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _op(opts):
    """The gs_redop_t of a call's options (their reduceOp; SUM without options)."""
    return T.gs_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)


def _create(store, rank, size, timeout):
    return ProcessGroupGradstream(store, rank, size, timeout)


def register():
    if "gradstream" not in dist.Backend.backend_list:
        dist.Backend.register_backend("gradstream", _create, devices=["cpu", "cuda"])
