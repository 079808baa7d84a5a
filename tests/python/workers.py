"""Rank-side scenarios of the Python tests: `workers.py SCENARIO [ARGS]` runs as one rank of a
launch (conftest.launch), asserts what it can see locally, and writes a JSON result for the
test to compare across ranks. Exit code 0 means every local assertion held."""
import datetime
import io
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import gradstream
import gradstream.torch as gt

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def report(**result):
    with open(os.environ["GS_TEST_RESULT"], "w") as f:
        json.dump(result, f)


def init(timeout_s=60):
    dist.init_process_group("gradstream", timeout=datetime.timedelta(seconds=timeout_s))
    assert dist.get_backend() == "gradstream", dist.get_backend()
    assert dist.get_rank() == RANK and dist.get_world_size() == WORLD


def expect_error(kind, fragment, fn):
    try:
        fn()
    except kind as e:
        assert fragment in str(e), f"error '{e}' does not mention '{fragment}'"
        return str(e)
    raise AssertionError(f"expected {kind.__name__} mentioning '{fragment}'")


# -- every collective and dtype, exact --------------------------------------------------------
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8]


def values(rank, n, dtype, op):
    """Small integers: every sum, product, min, max and average here is exact in every dtype."""
    i = torch.arange(n)
    if op == "prod":
        v = ((i + rank) % 3 == 0).to(torch.int64) + 1
    elif op in ("min", "max"):
        v = (i * 7 + rank * 5) % 50
    else:
        v = i % 5 + rank * 2
    return v.to(dtype)


def reference(n, dtype, op):
    stack = torch.stack([values(r, n, torch.float64, op) for r in range(WORLD)])
    if op == "sum":
        out = stack.sum(0)
    elif op == "avg":
        out = stack.sum(0) / WORLD
    elif op == "prod":
        out = stack.prod(0)
    elif op == "min":
        out = stack.min(0).values
    else:
        out = stack.max(0).values
    return out.to(dtype)


OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


def collectives():
    init()
    n = 1237  # odd: blocks of uneven size
    checked = 0
    for dtype in FLOATS + INTS:
        ops = ["sum", "min", "max", "prod"] + (["avg"] if dtype.is_floating_point else [])
        for op in ops:
            t = values(RANK, n, dtype, op)
            dist.all_reduce(t, op=OPS[op])
            assert torch.equal(t, reference(n, dtype, op)), (dtype, op, t[:8])
            checked += 1
        for root in range(WORLD):
            b = torch.full((n,), RANK + 1, dtype=dtype)
            dist.broadcast(b, src=root)
            assert torch.equal(b, torch.full((n,), root + 1, dtype=dtype)), (dtype, root)
        mine = (torch.arange(n) % 7 + RANK * 3).to(dtype)
        outs = [torch.empty(n, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(outs, mine)
        for r in range(WORLD):
            assert torch.equal(outs[r], (torch.arange(n) % 7 + r * 3).to(dtype)), (dtype, r)
        flat = torch.empty(WORLD * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, mine)
        assert torch.equal(flat, torch.cat(outs)), dtype
        blocks = [values(RANK, n, dtype, "sum") + j for j in range(WORLD)]
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter(out, blocks)
        want = sum(values(r, n, torch.float64, "sum") for r in range(WORLD)) + WORLD * RANK
        assert torch.equal(out, want.to(dtype)), dtype
        out2 = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out2, torch.cat(blocks))
        assert torch.equal(out2, out), dtype
        checked += 4
    # Several tensors, mixed dtypes, in one call (ProcessGroup.allreduce with a list, and the
    # coalesced form that flattens per dtype).
    pg = dist.distributed_c10d._get_default_group()
    a, b = torch.ones(100), torch.full((7,), 2, dtype=torch.int64)
    pg.allreduce([a, torch.ones(5)], dist.AllreduceOptions()).wait()
    assert torch.equal(a, torch.full((100,), float(WORLD)))
    pg.allreduce_coalesced([a, b], dist.AllreduceCoalescedOptions()).wait()
    assert torch.equal(a, torch.full((100,), float(WORLD * WORLD)))
    assert torch.equal(b, torch.full((7,), 2 * WORLD, dtype=torch.int64))
    # Non-contiguous tensors: staged through a contiguous copy and written back.
    m = torch.arange(60, dtype=torch.float32).reshape(6, 10) * (RANK + 1)
    view = m[:, ::3]
    dist.all_reduce(view)
    tri = WORLD * (WORLD + 1) / 2
    assert torch.equal(view, (torch.arange(60, dtype=torch.float32).reshape(6, 10) * tri)[:, ::3])
    assert torch.equal(m[:, 1], torch.arange(60, dtype=torch.float32).reshape(6, 10)[:, 1] *
                       (RANK + 1)), "elements outside the view changed"
    tposed = (torch.arange(12, dtype=torch.float64).reshape(3, 4) * (RANK + 1)).t()
    dist.broadcast(tposed, src=0)  # a transposed view: staged, then written back
    assert torch.equal(tposed, torch.arange(12, dtype=torch.float64).reshape(3, 4).t())
    # rooted collectives built on the others
    r = torch.full((9,), float(RANK + 1))
    dist.reduce(r, dst=WORLD - 1)
    if RANK == WORLD - 1:
        assert torch.equal(r, torch.full((9,), tri))
    g = [torch.empty(3) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(torch.full((3,), float(RANK)), gather_list=g, dst=0)
    if RANK == 0:
        assert all(torch.equal(g[k], torch.full((3,), float(k))) for k in range(WORLD))
    s = torch.empty(4)
    dist.scatter(s, [torch.full((4,), float(k * 10)) for k in range(WORLD)] if RANK == 1 else None,
                 src=1)
    assert torch.equal(s, torch.full((4,), float(RANK * 10)))
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": k} for k in range(WORLD)]
    dist.barrier()
    # A big tensor: many chunks in the pipeline.
    big = torch.full((3 << 20,), float(RANK))
    dist.all_reduce(big)
    assert torch.equal(big, torch.full((3 << 20,), float(sum(range(WORLD)))))
    st = gt.stats()
    assert st["collectives"] > checked and st["bytes_wire"] > 0 and st["errors"] == 0, st
    dist.destroy_process_group()
    report(checked=checked, transport=st["transport"])


def asynchronous():
    """async_op works complete by themselves: futures done without wait(), in issue order."""
    init()
    tensors = [torch.full((200000,), float(RANK + k)) for k in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    order = []
    futures = [w.get_future() for w in works]
    for k, f in enumerate(futures):
        f.then(lambda _, k=k: order.append(k))
    gather_out = torch.empty(WORLD * 4)
    futures.append(dist.all_gather_into_tensor(gather_out, torch.full((4,), float(RANK)),
                                               async_op=True).get_future())
    deadline = time.monotonic() + 30
    while not all(f.done() for f in futures):  # nobody waits: the progress thread completes
        assert time.monotonic() < deadline, "futures not done within 30 s without wait()"
        time.sleep(0.001)
    assert order == list(range(6)), order
    base = sum(range(WORLD))
    for k, t in enumerate(tensors):
        assert torch.equal(t, torch.full_like(t, float(base + WORLD * k))), k
        assert futures[k].value()[0] is t
    assert torch.equal(gather_out, torch.arange(WORLD).repeat_interleave(4).float())
    for w in works:
        assert w.wait() and w.is_completed()
    # A small host allreduce runs inline, behind what was queued before it (issue order): it
    # returns completed, with the sum, while a large one issued first is still exact.
    big = torch.full((500000,), float(RANK))
    big_work = dist.all_reduce(big, async_op=True)
    small = torch.full((3,), float(RANK + 1))
    small_work = dist.all_reduce(small, async_op=True)
    assert small_work.is_completed(), "a 12-byte host allreduce did not return completed"
    assert torch.equal(small, torch.full((3,), float(sum(range(1, WORLD + 1)))))
    assert big_work.wait() and torch.equal(big, torch.full_like(big, float(base)))
    # A then() callback runs on the progress thread, inside the request it completes: a small
    # allreduce issued there is queued (inline, it would wait for that very request).
    chained = []

    def follow(_):
        t = torch.ones(2)
        chained.append((t, dist.all_reduce(t, async_op=True)))

    dist.all_reduce(torch.ones(500000), async_op=True).get_future().then(follow).wait()
    t, w = chained[0]
    assert w.wait() and torch.equal(t, torch.full((2,), float(WORLD)))
    # A second group over all ranks, and one over ranks {0, 1}: each its own communicator.
    g = dist.new_group(backend="gradstream")
    sub = dist.new_group(ranks=[0, 1], backend="gradstream")
    before = gt.stats()["collectives"]
    t = torch.ones(10)
    dist.all_reduce(t, group=g)
    assert torch.equal(t, torch.full((10,), float(WORLD)))
    if RANK in (0, 1):
        u = torch.full((10,), float(RANK + 1))
        dist.all_reduce(u, group=sub)
        assert torch.equal(u, torch.full((10,), 3.0))
        assert gt.stats(sub)["collectives"] == 1
    assert gt.stats()["collectives"] == before, "the default group's communicator was used"
    assert gt.stats(g)["collectives"] == 1
    dist.destroy_process_group()
    report(order=order)


def bad_input():
    """Clear errors naming the argument, and the group still works afterwards."""
    init()
    expect_error(TypeError, "int8", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int8)))
    expect_error(TypeError, "int16", lambda: dist.broadcast(torch.ones(4, dtype=torch.int16), 0))
    expect_error(ValueError, "BAND",
                 lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND))
    expect_error(ValueError, "group size",
                 lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)))
    expect_error(ValueError, "group size",
                 lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(3)))
    expect_error(TypeError, "float64",
                 lambda: dist.all_gather_into_tensor(torch.empty(2 * WORLD, dtype=torch.float64),
                                                     torch.ones(2)))
    expect_error(ValueError, f"the group has {WORLD} ranks",
                 lambda: dist.all_gather([torch.empty(2) for _ in range(WORLD + 1)], torch.ones(2)))
    expect_error(ValueError, "input [0][1] is 3 x",
                 lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2), torch.ones(3)] +
                                             [torch.ones(2)] * (WORLD - 2)))
    expect_error(RuntimeError, "any source", lambda: dist.recv(torch.empty(2)))
    expect_error(ValueError, "itself", lambda: dist.isend(torch.ones(2), dst=RANK))
    expect_error(ValueError, "out of range",
                 lambda: dist.isend(torch.ones(2), group_dst=WORLD))
    expect_error(TypeError, "int16", lambda: dist.isend(torch.ones(2, dtype=torch.int16),
                                                        dst=(RANK + 1) % WORLD))
    expect_error(ValueError, "input_split_sizes",
                 lambda: dist.all_to_all_single(torch.empty(WORLD), torch.ones(WORLD),
                                                input_split_sizes=[1] * (WORLD + 1)))
    pg = dist.distributed_c10d._get_default_group()
    msg = expect_error(ValueError, "unknown communicator option",
                       lambda: pg.new_communicator(bogus=1))
    expect_error(ValueError, "codec='auto' only", lambda: gt.GradstreamState(codec="int8",
                                                                             codec_floor="int4"))
    # complex tensors: torch hands them over as real views, summed exactly
    c = torch.full((3,), 1 + 2j, dtype=torch.complex64)
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((3,), WORLD * (1 + 2j), dtype=torch.complex64))
    t = torch.ones(8)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((8,), float(WORLD)))
    # Registered tensors (gs_comm_register): collectives on them stay exact; the registration
    # ends once, a second deregister says so, and non-contiguous or non-tensors are refused.
    expect_error(ValueError, "not contiguous",
                 lambda: gt.register_tensor(torch.ones(4, 4).t()))
    expect_error(TypeError, "needs a tensor", lambda: gt.register_tensor([1.0]))
    bucket = torch.empty(300000)
    with gt.register_tensor(bucket) as reg:
        reg_handle = reg._handle
        for k in range(3):
            bucket.fill_(float(RANK + k))
            dist.all_reduce(bucket)
            assert torch.equal(bucket, torch.full((300000,), float(sum(range(WORLD)) + WORLD * k)))
    expect_error(Exception, "gs_comm_deregister", lambda: pg.communicator.deregister(reg_handle))
    dist.destroy_process_group()
    report(msg=msg)


def rooted_and_alltoall():
    """reduce (every dtype, every root, a non-contiguous tensor), all_to_all_single with equal
    and unequal splits, all_to_all with tensors of different sizes, barrier: exact."""
    init()
    checked = 0
    for dtype in FLOATS + INTS:
        for root in range(WORLD):
            for n in (1, 7, 20000):
                t = values(RANK, n, dtype, "sum")
                before = t.clone()
                dist.reduce(t, dst=root)
                want = reference(n, dtype, "sum") if RANK == root else before
                assert torch.equal(t, want), (dtype, root, n)
                checked += 1
    m = torch.arange(24, dtype=torch.float32).reshape(4, 6) + RANK
    col = m[:, 1]  # non-contiguous
    dist.reduce(col, dst=0, op=dist.ReduceOp.MAX)
    if RANK == 0:
        assert torch.equal(col, torch.arange(4, dtype=torch.float32) * 6 + 1 + WORLD - 1)

    # all_to_all_single, equal splits: element k of block j from rank r is 1000 r + 10 j + k
    per = 3
    inp = torch.tensor([1000 * RANK + 10 * j + k for j in range(WORLD) for k in range(per)],
                       dtype=torch.float64)
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.tensor([1000 * i + 10 * RANK + k for i in range(WORLD) for k in range(per)],
                        dtype=torch.float64)
    assert torch.equal(out, want), out
    # unequal splits along dim 0 (rows of 2): rank r sends j + r rows to rank j
    send_rows = [j + RANK for j in range(WORLD)]
    recv_rows = [RANK + i for i in range(WORLD)]
    inp = torch.cat([torch.full((send_rows[j], 2), float(100 * RANK + j)) for j in range(WORLD)])
    out = torch.empty(sum(recv_rows), 2)
    work = dist.all_to_all_single(out, inp, output_split_sizes=recv_rows,
                                  input_split_sizes=send_rows, async_op=True)
    work.wait()
    want = torch.cat([torch.full((recv_rows[i], 2), float(100 * i + RANK)) for i in range(WORLD)])
    assert torch.equal(out, want), out
    # all_to_all: a tensor per peer, sizes differing per pair, int64
    ins = [torch.full((RANK + j + 1,), 10 * RANK + j, dtype=torch.int64) for j in range(WORLD)]
    outs = [torch.empty(i + RANK + 1, dtype=torch.int64) for i in range(WORLD)]
    dist.all_to_all(outs, ins)
    for i in range(WORLD):
        assert torch.equal(outs[i], torch.full((i + RANK + 1,), 10 * i + RANK, dtype=torch.int64))
    dist.barrier()
    dist.destroy_process_group()
    report(checked=checked)


def comm_split():
    """gradstream.Communicator.split under torch: halves ranked by key, a collective on each
    child, the NOCOLOR rank gets None, the parent keeps working."""
    import ctypes
    import threading
    init()
    parent = dist.distributed_c10d._get_default_group().communicator
    child = parent.split(RANK % 2, key=-RANK)
    members = sorted((r for r in range(WORLD) if r % 2 == RANK % 2), reverse=True)
    assert (child.rank, child.size) == (members.index(RANK), len(members)), (child.rank,
                                                                             child.size)
    value = ctypes.c_int64(RANK + 1)
    out = ctypes.c_int64(0)
    done = threading.Event()
    status = []
    child.allreduce(ctypes.addressof(value), ctypes.addressof(out), 1, 5, 0,
                    lambda st, msg: (status.append((st, msg)), done.set()))
    assert done.wait(30) and status[0][0] == 0, status
    assert out.value == sum(r + 1 for r in members), out.value
    child.barrier()
    child.destroy()
    none = parent.split(-1 if RANK == 0 else 3)
    assert (none is None) == (RANK == 0)
    if none is not None:
        assert none.size == WORLD - 1
        none.destroy()
    dist.barrier()
    dist.destroy_process_group()
    report(size=len(members))


# -- point-to-point ----------------------------------------------------------------------------
def message(src, dst, n, dtype, k=0):
    """Message k from src to dst: integers exact in float32, distinct per pair and k."""
    return ((torch.arange(n) * 7) % 1009 + 1009 * (src * WORLD + dst) + 20000 * k).to(dtype)


def wait_done(works, seconds=60):
    """Waits for the works' futures without wait() (the progress thread completes them), then
    wait()s each to raise a failure."""
    futures = [w.get_future() for w in works]
    deadline = time.monotonic() + seconds
    while not all(f.done() for f in futures):
        assert time.monotonic() < deadline, f"point-to-point works not done within {seconds} s"
        time.sleep(0.001)
    for w in works:
        w.wait()


def gather_scatter():
    """dist.gather / dist.scatter as messages between the root and each rank: every root,
    several dtypes, empty and non-contiguous tensors, behind a queued allreduce of the same
    tensor, exact; and what each rank sends (bytes_logical) is its own block only (gather) or
    the root's N-1 blocks only (scatter), not what an allgather or broadcast would move."""
    init()
    checked = 0
    for root in range(WORLD):
        for dtype, n in ((torch.float32, 1 << 18), (torch.int64, 1001), (torch.bfloat16, 37),
                         (torch.uint8, 0)):
            mine = message(RANK, root, n, dtype)
            outs = [torch.full((n,), 7, dtype=dtype) for _ in range(WORLD)]
            before = gt.stats()["bytes_logical"]
            dist.gather(mine, gather_list=outs if RANK == root else None, dst=root)
            sent = gt.stats()["bytes_logical"] - before
            size = n * mine.element_size()
            assert sent == (0 if RANK == root else size), (root, dtype, sent, size)
            if RANK == root:
                for r in range(WORLD):
                    assert torch.equal(outs[r], message(r, root, n, dtype)), (root, dtype, r)
                checked += 1
            into = torch.full((n,), 7, dtype=dtype)
            blocks = [message(root, r, n, dtype) for r in range(WORLD)]
            before = gt.stats()["bytes_logical"]
            dist.scatter(into, blocks if RANK == root else None, src=root)
            sent = gt.stats()["bytes_logical"] - before
            assert sent == ((WORLD - 1) * size if RANK == root else 0), (root, dtype, sent)
            assert torch.equal(into, blocks[RANK]), (root, dtype, into[:8])
            checked += 1
    # Non-contiguous: the root gathers into and scatters from transposed views, the others
    # receive into a strided view (written back, nothing outside it touched).
    base = message(RANK, 0, 24, torch.float32).reshape(4, 6)
    holders = [torch.full((6, 4), -1.0).t() for _ in range(WORLD)]
    dist.gather(base, gather_list=holders if RANK == 0 else None, dst=0)
    if RANK == 0:
        for r in range(WORLD):
            assert torch.equal(holders[r], message(r, 0, 24, torch.float32).reshape(4, 6)), r
        checked += 1
    holder = torch.full((4, 12), -1.0)
    dist.scatter(holder[:, ::2], [message(0, r, 24, torch.float32).reshape(6, 4).t()
                                  for r in range(WORLD)] if RANK == 0 else None, src=0)
    assert torch.equal(holder[:, ::2], message(0, RANK, 24, torch.float32).reshape(6, 4).t())
    assert torch.equal(holder[:, 1::2], torch.full((4, 6), -1.0)), "wrote outside the view"
    checked += 1
    # Behind a queued allreduce of the very tensor (issue order): the root's own block too is
    # the sum, and async gathers and scatters complete by themselves, in order.
    big = torch.full((1 << 19,), float(RANK + 1))
    reduced = dist.all_reduce(big, async_op=True)
    outs = [torch.empty_like(big) for _ in range(WORLD)] if RANK == WORLD - 1 else None
    works = [reduced, dist.gather(big, gather_list=outs, dst=WORLD - 1, async_op=True)]
    spread = torch.empty(5)
    works.append(dist.scatter(spread, [torch.full((5,), float(r)) for r in range(WORLD)]
                              if RANK == 0 else None, src=0, async_op=True))
    wait_done(works)
    total = float(sum(range(1, WORLD + 1)))
    if RANK == WORLD - 1:
        assert all(torch.equal(o, torch.full_like(big, total)) for o in outs), "gather read early"
    assert torch.equal(spread, torch.full((5,), float(RANK)))
    checked += 2
    dist.destroy_process_group()
    report(checked=checked)


def p2p():
    """send / recv / isend / irecv / batch_isend_irecv: every ordered pair blocking,
    non-contiguous at both ends, an 8 MiB ring shift posted send-first on every rank, the ring
    both ways in a batch in either order, several messages to one peer matched in posting order
    whatever their tags, a subgroup's rank numbering, the Communicator's own blocking calls:
    all exact, int64 and float32."""
    init()
    checked = 0
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    # Blocking, every ordered pair in one order on all ranks: each send waits for its receive.
    for src in range(WORLD):
        for dst in range(WORLD):
            if src == dst or RANK not in (src, dst):
                continue
            for dtype in (torch.int64, torch.float32):
                want = message(src, dst, 1001, dtype)
                if RANK == src:
                    dist.send(want, dst=dst)
                else:
                    got = torch.full_like(want, -1)
                    assert dist.recv(got, src=src) == src
                    assert torch.equal(got, want), (src, dst, dtype, got[:8])
                    checked += 1
    # Non-contiguous: a transposed view sent, a strided view received (written back).
    base = message(0, 1, 24, torch.float32).reshape(4, 6)
    if RANK == 0:
        dist.send(base.t(), dst=1)
    elif RANK == 1:
        holder = torch.full((6, 8), -1.0)
        dist.recv(holder[:, ::2], src=0)
        assert torch.equal(holder[:, ::2], base.t()), holder
        assert torch.equal(holder[:, 1::2], torch.full((6, 4), -1.0)), "wrote outside the view"
        checked += 1
    # Ring shift, isend before irecv on every rank, far more than the receive slots hold.
    n = 2 << 20  # 8 MiB of float32
    for dtype in (torch.float32, torch.int64):
        into = torch.full((n,), -1, dtype=dtype)
        wait_done([dist.isend(message(RANK, nxt, n, dtype), dst=nxt),
                   dist.irecv(into, src=prv)])
        assert torch.equal(into, message(prv, RANK, n, dtype)), (dtype, into[:8])
        checked += 1
    # batch_isend_irecv both ways round the ring; the list's order does not matter.
    for sends_first in (True, False):
        from_prev, from_next = torch.empty(3001), torch.empty(2999, dtype=torch.int64)
        sends = [dist.P2POp(dist.isend, message(RANK, nxt, 3001, torch.float32, 1), nxt),
                 dist.P2POp(dist.isend, message(RANK, prv, 2999, torch.int64, 2), prv)]
        recvs = [dist.P2POp(dist.irecv, from_prev, prv), dist.P2POp(dist.irecv, from_next, nxt)]
        ops = sends + recvs if sends_first == (RANK % 2 == 0) else recvs + sends
        wait_done(dist.batch_isend_irecv(ops))
        assert torch.equal(from_prev, message(prv, RANK, 3001, torch.float32, 1))
        assert torch.equal(from_next, message(nxt, RANK, 2999, torch.int64, 2))
        checked += 2
    # Several messages to one peer: matched in posting order, tags ignored (they disagree).
    sizes = [5, 7, 5, 7, 0, 70000, 1]  # an empty message too
    dtypes = [torch.float32 if k % 2 == 0 else torch.int64 for k in range(len(sizes))]
    works = [dist.isend(message(RANK, nxt, m, dt, k), dst=nxt, tag=100 - k)
             for k, (m, dt) in enumerate(zip(sizes, dtypes))]
    intos = [torch.full((m,), -1, dtype=dt) for m, dt in zip(sizes, dtypes)]
    works += [dist.irecv(t, src=prv, tag=k) for k, t in enumerate(intos)]
    wait_done(works)
    for k, t in enumerate(intos):
        assert torch.equal(t, message(prv, RANK, sizes[k], dtypes[k], k)), (k, t[:8])
        checked += 1
    # A subgroup: torch hands the backend group ranks (global 1, 2 are its 0, 1).
    if WORLD >= 3:
        sub = dist.new_group(ranks=[1, 2], backend="gradstream")
        if RANK == 2:
            dist.send(message(2, 1, 99, torch.int64, 3), dst=1, group=sub)
            back = torch.empty(99, dtype=torch.int64)
            assert dist.recv(back, group_src=0, group=sub) == 1
            assert torch.equal(back, message(1, 2, 99, torch.int64, 4))
            checked += 1
        elif RANK == 1:
            got = torch.empty(99, dtype=torch.int64)
            assert dist.recv(got, src=2, group=sub) == 2
            assert torch.equal(got, message(2, 1, 99, torch.int64, 3))
            dist.send(message(1, 2, 99, torch.int64, 4), group_dst=1, group=sub)
            checked += 1
    # The Communicator's blocking send / recv (buffer addresses): a ping-pong 0 <-> 1.
    comm = dist.distributed_c10d._get_default_group().communicator
    int64 = gradstream.DTYPES["int64"]
    ping, pong = message(0, 1, 513, torch.int64, 5), torch.empty(513, dtype=torch.int64)
    if RANK == 0:
        comm.send(ping.data_ptr(), ping.numel(), int64, 1)
        comm.recv(pong.data_ptr(), pong.numel(), int64, 1)
        assert torch.equal(pong, ping + 1)
        checked += 1
    elif RANK == 1:
        comm.recv(pong.data_ptr(), pong.numel(), int64, 0)
        assert torch.equal(pong, ping)
        pong += 1
        comm.send(pong.data_ptr(), pong.numel(), int64, 0)
        checked += 1
    t = torch.ones(3)
    dist.all_reduce(t)  # a collective after the messages: issue order
    assert torch.equal(t, torch.full((3,), float(WORLD)))
    assert gt.stats()["errors"] == 0
    dist.destroy_process_group()
    report(checked=checked)


def p2p_codec():
    """GS_CODEC=bf16: float messages travel through the codec (within bf16's precision, not
    all exact), int64 ones exact."""
    init()
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    n = 100003

    def floats(r):
        return torch.linspace(-3, 3, n) + 0.001 * r

    got_f, got_i = torch.empty(n), torch.empty(n, dtype=torch.int64)
    ints = message(RANK, nxt, n, torch.int64) * 4097  # not representable in bf16
    wait_done([dist.isend(floats(RANK), dst=nxt), dist.isend(ints, dst=nxt),
               dist.irecv(got_f, src=prv), dist.irecv(got_i, src=prv)])
    want = floats(prv)
    assert torch.equal(got_i, message(prv, RANK, n, torch.int64) * 4097), "int64 not exact"
    err = ((got_f - want).abs() / want.abs().clamp_min(1e-30)).max().item()
    assert err <= 2 ** -8, f"relative error {err} beyond bf16's"
    assert not torch.equal(got_f, want), "float32 message arrived exact: the codec was skipped"
    as_torch_rounds = torch.equal(got_f, want.to(torch.bfloat16).float())
    dist.destroy_process_group()
    report(max_rel_error=err, as_torch_rounds=as_torch_rounds)


def p2p_mismatch():
    """A send and its receive disagreeing on count: both ranks raise naming both counts
    before the timeout, the receive buffer untouched; rank 2, when there is one, only leaves."""
    init(timeout_s=int(os.environ.get("GS_TEST_PG_TIMEOUT", "20")))
    t = torch.ones(4)
    dist.all_reduce(t)
    result = {}
    if RANK in (0, 1):
        into = torch.full((1001,), -1, dtype=torch.int64)
        start = time.monotonic()
        try:
            if RANK == 0:
                dist.send(torch.arange(1000, dtype=torch.int64), dst=1)
            else:
                dist.recv(into, src=0)
            raise AssertionError("a send and a receive of different counts went through")
        except RuntimeError as e:
            result.update(message=str(e), elapsed=time.monotonic() - start)
        assert torch.equal(into, torch.full((1001,), -1, dtype=torch.int64)), \
            "the refused message was written"
    start = time.monotonic()
    dist.destroy_process_group()
    report(destroy=time.monotonic() - start, **result)


def dead_rank():
    """The last rank dies (os._exit) mid-job; the others must raise, not hang."""
    init(timeout_s=int(os.environ.get("GS_TEST_PG_TIMEOUT", "20")))
    t = torch.ones(1000)
    dist.all_reduce(t)
    if RANK == WORLD - 1:
        os._exit(3)
    time.sleep(0.5)  # the peer is gone before the next collective starts
    start = time.monotonic()
    try:
        for _ in range(3):
            dist.all_reduce(t)
        raise AssertionError("all_reduce with a dead rank succeeded")
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        message = str(e)
    start = time.monotonic()
    dist.destroy_process_group()
    report(elapsed=elapsed, message=message, destroy=time.monotonic() - start)


# -- DDP and the comm hook ---------------------------------------------------------------------
def make_model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10))


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def flat_grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def same_on_every_rank(t):
    gathered = torch.empty(WORLD * t.numel(), dtype=t.dtype)
    dist.all_gather_into_tensor(gathered, t.contiguous())
    return all(torch.equal(gathered[r * t.numel():(r + 1) * t.numel()], t) for r in range(WORLD))


def train(state, steps, lr=0.05, after_step=None):
    """DDP with small buckets (several per model), the hook with state (None: DDP's own
    allreduce; a callable: state(model)); after_step(step, state) runs after each step; returns
    the model, the averaged gradients of every step and the losses."""
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    if callable(state):
        state = state(model)
    if state is not None:
        ddp.register_comm_hook(state, gt.comm_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads, losses = [], []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        grads.append(flat_grads(model).clone())
        losses.append(loss.item())
        opt.step()
        if after_step is not None:
            after_step(step, state)
    return model, grads, losses


def hooks():
    init()
    _, ref, ref_losses = train(None, 6)
    result = {}
    for codec, ef, tol in (("raw", False, 1e-6), ("bf16", False, 2e-2), ("int8", True, 3e-2),
                           ("int4", True, 6e-1)):
        state = gt.GradstreamState(codec=codec, error_feedback=ef)
        before = gt.stats()
        model, grads, losses = train(state, 6)
        after = gt.stats()
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert same_on_every_rank(params), f"{codec}: replicas differ"
        for g in grads:
            assert same_on_every_rank(g), f"{codec}: averaged gradients differ between ranks"
        errors = [float((g - r).norm() / r.norm()) for g, r in zip(grads, ref)]
        assert max(errors) < tol, f"{codec}: gradient error {max(errors)} >= {tol}"
        # Error feedback sends later what a step dropped: the sum over steps is closer to the
        # reference than the worst single step.
        cumulative = float((sum(grads) - sum(ref)).norm() / sum(ref).norm())
        if ef:
            assert cumulative < max(errors), f"{codec}: cumulative {cumulative} vs {errors}"
        n_buckets = len(state._streams)
        assert n_buckets >= 2, f"expected several buckets, got {n_buckets}"
        # DDP rebuilds its buckets after the first iteration: every stream reopened once.
        # DDP rebuilds its buckets after the first iteration: each stream reopened once then,
        # never again (a stream per bucket for the rest of training).
        assert n_buckets < state.rebinds <= 2 * n_buckets + 2, (state.rebinds, n_buckets)
        wire = after["bytes_wire"] - before["bytes_wire"]
        logical = after["bytes_logical"] - before["bytes_logical"]
        residual_bytes = sum(v.numel() for v in state.state_dict()["residuals"].values())
        if ef:
            assert residual_bytes == 4 * params.numel(), residual_bytes
        else:
            assert residual_bytes == 0
        result[codec] = {"max_rel_error": max(errors), "cumulative_rel_error": cumulative,
                         "compression": logical / wire,
                         "losses": losses}
        state.close()
    assert ref_losses == result["raw"]["losses"] or max(
        abs(a - b) for a, b in zip(ref_losses, result["raw"]["losses"])) < 1e-5
    dist.destroy_process_group()
    report(**result)


def residual_follows_parameters():
    """The residual a lossy step leaves reaches the next step although DDP rebuilt its buckets
    in between (new buffers, parameters regrouped), exactly and at the right parameters:
    step 1 with the live residual is bit-identical to step 1 after the residual went out through
    state_dict() and back in through load_state_dict(); with it cleared step 1 differs; with it
    scaled by 100 step 1 moves by 100 x the ranks' mean residual, parameter by parameter."""
    init()
    runs, saved = {}, {}
    for mode in ("live", "reloaded", "cleared", "scaled"):
        def after(step, state, mode=mode):
            if step != 0:
                return
            sd = state.state_dict()
            saved[mode] = sd
            if mode == "live":
                return
            factor = {"reloaded": 1, "cleared": 0, "scaled": 100}[mode]
            scaled = {k: (v.view(torch.float32) * factor).view(torch.uint8)
                      for k, v in sd["residuals"].items()}
            state.load_state_dict(io_roundtrip(dict(sd, residuals=scaled)))

        model, grads, _ = train(lambda m: gt.GradstreamState(codec="int8", error_feedback=True,
                                                             model=m),
                                2, lr=0.0, after_step=after)  # lr 0: the same weights each step
        runs[mode] = grads[1]
        names = [name for name, _ in model.named_parameters()]
    assert torch.equal(runs["live"], runs["reloaded"]), \
        "the residual carried across the rebuild differs from the one saved and reloaded"
    assert not torch.equal(runs["live"], runs["cleared"]), "the residual did not matter"
    residual = torch.cat([saved["live"]["residuals"][n].view(torch.float32) for n in names])
    dist.all_reduce(residual, op=dist.ReduceOp.AVG)
    moved = (runs["scaled"] - runs["cleared"]) / 100
    err = float((moved - residual).norm() / residual.norm())
    assert err < 0.1, f"step 1 moved by {moved.norm()} not by the mean residual {residual.norm()}"
    dist.destroy_process_group()
    report(error=err, residual_norm=residual.norm().item())


def io_roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf)


def auto_hook():
    init()
    state = gt.GradstreamState(codec="auto", error_feedback=True, codec_ladder="raw,bf16,int8",
                               codec_floor="int8")
    model, grads, _ = train(state, 4)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert same_on_every_rank(params), "replicas differ"
    st = state.stats()
    assert st["collectives"] > 0, "the auto hook's own communicator carried nothing"
    state.close()
    dist.destroy_process_group()
    report(collectives=st["collectives"])


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
