"""One rank of the soak (bench/soak.py rank): draws, runs and checks the collectives of each
iteration, rank 0 deciding over the communicator when to start a new communicator or stop."""
import ctypes
import faulthandler
import gc
import hashlib
import json
import os
import sys
import threading
import time

import numpy as np

from soak_data import Arena, Check, address, contribution, fill, reduce_exact, to_storage
from soak_draw import (CONTROL_EVERY, DTYPES, KINDS, MAX_BYTES, PERIOD, PROD_FACTOR, TOLERANCE,
                       UID_BYTES, MiB, buffer_elems, codec_family, comm_options, draw_iteration,
                       fit_batch, payload_bytes)
from soak_proc import fd_kinds, malloc_trim, proc_sample


T0 = time.time()


def log(*args):
    print(f"[{time.time() - T0:7.1f}s]", *args, file=sys.stderr, flush=True)


class Fatal(Exception):
    """A collective failed or did not finish: the communicator is unusable, the rank exits."""


class Rank:
    def __init__(self, args):
        import gradstream
        from gradstream import _lib
        self.gs, self.L = gradstream, _lib.lib
        self.args = args
        self.rank, self.n, self.seed = args.rank, args.ranks, args.seed
        self.env_codec = os.environ.get("GS_CODEC")  # GS_* variables win over the options
        self.out = open(os.path.join(args.dir, f"rank{self.rank}.jsonl"), "a", buffering=1)
        self.send_arena = Arena(MAX_BYTES + 4 * MiB)
        self.recv_arena = Arena(MAX_BYTES + 4 * MiB)
        self.comm = None
        self.epoch = -1
        self.comm_opts = None
        self.it = 0
        self.where = "start-up"  # what the rank is doing, for the watchdog and errors
        self.progress = time.monotonic()
        self.counts = {k: 0 for k in KINDS}
        self.counts.update(blocking=0, nonblocking=0, control=0, inplace=0, checked_exact=0,
                           checked_tolerance=0, replica_checks=0, zero_count=0)
        self.bytes_payload = 0
        self.lib_bytes_logical = self.lib_bytes_wire = 0
        self.comms_created = 0
        self.seconds = {"prepare": 0.0, "collectives": 0.0, "check": 0.0}
        self.slowest = (0.0, -1, [])  # (seconds, iteration, its collectives)
        self.failures = 0
        self.max_rel = {}  # codec family -> (error / bound, error, bound, of what): the closest
        self.transports = {}
        self.algorithms = {}
        self._blocking_prototypes()

    def _blocking_prototypes(self):
        """The C API's blocking collectives (the Python layer issues the non-blocking ones)."""
        from gradstream import _lib
        c = ctypes
        p = [_lib.c_ptr, _lib.c_ptr, _lib.c_size, c.c_int, c.c_int, _lib.c_comm, _lib.c_stream]
        for name, argtypes in (("gs_allreduce", p), ("gs_reduce_scatter", p),
                               ("gs_allgather", p[:4] + p[5:]), ("gs_broadcast", p)):
            fn = getattr(self.L, name)
            fn.argtypes = argtypes
            fn.restype = c.c_int

    # -- records --------------------------------------------------------------------------------
    def record(self, **entry):
        entry["t"] = round(time.time() - self.args.t0, 3)
        self.out.write(json.dumps(entry) + "\n")

    def context(self, j=None, spec=None):
        ctx = {"seed": self.seed, "epoch": self.epoch, "iter": self.it, "comm": self.comm_opts}
        if self.env_codec:
            ctx["GS_CODEC"] = self.env_codec  # wins over comm's codec
        if j is not None:
            ctx["op"] = j
            ctx["spec"] = spec
        return ctx

    def wrong(self, what, j, spec, detail):
        self.failures += 1
        ctx = self.context(j, spec)
        self.record(type="failure", what=what, detail=detail, **ctx)
        if self.failures <= 20:
            log(f"rank {self.rank}: WRONG {what}: {detail}; reproduce: seed {self.seed} epoch "
                f"{self.epoch} iter {self.it} op {j} spec {json.dumps(spec)} comm "
                f"{json.dumps(self.comm_opts)}")

    def fatal(self, what, j=None, spec=None):
        self.failures += 1
        ctx = self.context(j, spec)
        self.record(type="failure", what=what, fatal=True, **ctx)
        log(f"rank {self.rank}: FAILED {what}; context {json.dumps(ctx)}")
        raise Fatal(what)

    def boundary(self, label):
        """Resources with no communicator alive and no buffers in flight: comparable points."""
        gc.collect()
        # Freed heap pages glibc keeps would read as growth: hand them back first, so the
        # count is of memory something still holds.
        if malloc_trim is not None:
            malloc_trim(0)
        rss, fds, threads, segs = proc_sample()
        self.record(type="boundary", label=label, epoch=self.epoch, iter=self.it, rss_kib=rss,
                    fds=fds, threads=threads, shm_segments=segs, fd_kinds=fd_kinds())

    # -- communicators --------------------------------------------------------------------------
    def codec(self):
        return self.env_codec or self.comm_opts["codec"]

    def open_comm(self, epoch, uid):
        opts, hosts, lifetime = comm_options(self.seed, epoch, self.n)
        self.epoch, self.comm_opts, self.lifetime = epoch, dict(opts), lifetime
        if hosts > 1:
            opts["hostname"] = f"soak-host{self.rank * hosts // self.n}"
            self.comm_opts["hostname"] = f"{hosts} hosts"
        self.where = f"creating communicator {epoch}"
        try:
            self.comm = self.gs.Communicator(uid, self.rank, self.n, **opts)
        except self.gs.GradstreamError as e:
            self.fatal(f"communicator {epoch} creation: {e}")
        self.comms_created += 1
        self.comm_born = time.monotonic()
        st = self.comm.stats()
        self.transports[st["transport"]] = self.transports.get(st["transport"], 0) + 1
        self.record(type="comm", epoch=epoch, first_iter=self.it, options=self.comm_opts,
                    transport=st["transport"])
        if self.rank == 0:
            log(f"communicator {epoch} at iteration {self.it}: {json.dumps(self.comm_opts)} "
                f"-> {st['transport']}")

    def close_comm(self):
        if self.comm is None:
            return
        self.where = f"destroying communicator {self.epoch}"
        try:
            st = self.comm.stats()
            self.lib_bytes_logical += st["bytes_logical"]
            self.lib_bytes_wire += st["bytes_wire"]
            if st["errors"]:
                self.fatal(f"communicator {self.epoch} counts {st['errors']} errors")
            self.comm.destroy()
        except self.gs.GradstreamError as e:
            self.fatal(f"destroy of communicator {self.epoch}: {e}")
        self.comm = None

    def publish_uid(self, epoch):
        """The unique id of communicator `epoch`: rank 0 makes it and writes it to a file
        (written, then renamed into place), the others read it. Not over the old communicator:
        then rank 0's listener would be open, and peers connecting to it, when the resources
        between communicators are counted."""
        path = os.path.join(self.args.dir, f"uid{epoch}")
        if self.rank == 0:
            uid = self.gs.unique_id()
            with open(path + ".tmp", "wb") as f:
                f.write(uid)
            os.rename(path + ".tmp", path)
            try:  # every rank has joined the previous communicator: its id is spent
                os.unlink(os.path.join(self.args.dir, f"uid{epoch - 1}"))
            except FileNotFoundError:
                pass
            return uid
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with open(path, "rb") as f:
                    uid = f.read()
                if len(uid) == UID_BYTES:
                    return uid
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        self.fatal(f"no unique id for communicator {epoch} from rank 0 within 120 s")

    # -- calls ----------------------------------------------------------------------------------
    def deadline_s(self):
        return int(os.environ.get("GS_TIMEOUT_MS", self.comm_opts["timeout_ms"])) / 1000 + 30

    def issue(self, spec, send, recv, blocking, on_done):
        """One collective: blocking through the C call, else through the Python layer."""
        kind, dt = spec["kind"], self.gs.DTYPES[spec["dtype"]]
        op = self.gs.OPS[spec["op"]] if spec["op"] else 0
        c, h = spec["count"], self.comm.handle
        if blocking:
            if kind == "allreduce":
                st = self.L.gs_allreduce(send, recv, c, dt, op, h, None)
            elif kind == "reduce_scatter":
                st = self.L.gs_reduce_scatter(send, recv, c, dt, op, h, None)
            elif kind == "allgather":
                st = self.L.gs_allgather(send, recv, c, dt, h, None)
            else:
                st = self.L.gs_broadcast(send, recv, c, dt, spec["root"], h, None)
            on_done(st, self.gs._lib.last_error() if st else "")
            return
        if kind == "allreduce":
            self.comm.allreduce(send, recv, c, dt, op, on_done)
        elif kind == "reduce_scatter":
            self.comm.reduce_scatter(send, recv, c, dt, op, on_done)
        elif kind == "allgather":
            self.comm.allgather(send, recv, c, dt, on_done)
        else:
            self.comm.broadcast(send, recv, c, dt, spec["root"], on_done)

    def wait_all(self, pending):
        """Waits for [(event, box, j, spec)], each within the deadline."""
        limit = time.monotonic() + self.deadline_s()
        for ev, box, j, spec in pending:
            if not ev.wait(max(0.0, limit - time.monotonic())):
                faulthandler.dump_traceback(all_threads=True)
                self.fatal(f"no completion within {self.deadline_s():.0f} s", j, spec)
            if box[0] != 0:
                self.fatal(f"{spec['kind']} completed with status {box[0]}: {box[1]}", j, spec)

    def done_box(self):
        ev, box = threading.Event(), [None, None]

        def on_done(status, message):
            box[0], box[1] = status, message
            self.progress = time.monotonic()
            ev.set()
        return ev, box, on_done

    def blocking_int_collective(self, kind, send, recv, count, dtype, root=0):
        """Raw control traffic of the soak itself (integers travel raw whatever the codec)."""
        self.counts["control"] += 1
        spec = {"kind": kind, "dtype": dtype, "count": count, "op": None, "root": root}
        ev, box, on_done = self.done_box()
        self.issue(spec, address(send), address(recv), True, on_done)
        if box[0] != 0:
            self.fatal(f"control {kind} failed with status {box[0]}: {box[1]}")

    # -- one collective -------------------------------------------------------------------------
    def prepare(self, j, spec):
        """Buffers filled, patterns of every rank, and what to check afterwards."""
        n = self.n
        kind, dtype = spec["kind"], spec["dtype"]
        lossy_float = DTYPES[dtype][2] and self.effective_codec(spec) != "raw"
        s_el, r_el = buffer_elems(spec, n)
        glob = s_el if kind == "reduce_scatter" else spec["count"]
        plen = max(1, min(glob, PERIOD))
        parts = [contribution(self.seed, self.it, j, r, spec, plen, lossy_float)
                 for r in range(n)]
        if kind in ("allreduce", "reduce_scatter", "stream"):
            expected = to_storage(reduce_exact(parts, spec, n), dtype)
        elif kind == "broadcast":
            expected = to_storage(parts[spec["root"]], dtype)
        else:
            expected = None  # allgather: block r is rank r's pattern
        scale = None
        if lossy_float and spec["op"] in ("sum", "avg"):
            scale = np.sum(np.abs(np.stack(parts)), axis=0) / (n if spec["op"] == "avg" else 1)
        mine = to_storage(parts[self.rank], dtype)
        pats = [to_storage(p, dtype) for p in parts] if kind == "allgather" else None
        mis = spec["misalign"]
        c = spec["count"]
        if spec["inplace"]:
            # NCCL's in-place layouts: rs recv = send + rank*c, ag send = recv + rank*c.
            buf = self.recv_arena.take(max(s_el, r_el), dtype, mis)
            buf.view(np.uint8).fill(0xA5)
            if kind == "reduce_scatter":
                fill(buf, mine, 0)
                send, recv = buf, buf[self.rank * c:(self.rank + 1) * c]
            elif kind == "allgather":
                send = buf[self.rank * c:(self.rank + 1) * c]
                fill(send, mine, 0)
                recv = buf
            else:
                if kind != "broadcast" or self.rank == spec["root"]:
                    fill(buf, mine, 0)
                send = recv = buf
        else:
            send = self.send_arena.take(s_el, dtype, mis)
            recv = self.recv_arena.take(r_el, dtype, mis)
            fill(send, mine, 0)
            recv.view(np.uint8).fill(0xA5)
        return {"j": j, "spec": spec, "send": send, "recv": recv, "expected": expected,
                "mine": mine, "pats": pats, "lossy": lossy_float, "scale": scale}

    def effective_codec(self, spec):
        if spec["kind"] == "stream" and spec.get("stream_codec"):
            return spec["stream_codec"]
        return self.codec()

    def verify(self, prep):
        spec, j = prep["spec"], prep["j"]
        kind, dtype, c = spec["kind"], spec["dtype"], spec["count"]
        codec = self.effective_codec(spec)
        fam = codec_family(codec) if prep["lossy"] else "raw"
        tol = TOLERANCE[fam]
        if spec["op"] == "prod":
            tol *= PROD_FACTOR
        if kind == "stream" and spec["error_feedback"] and spec["iterations"] > 1:
            tol *= 2  # the residual of the previous iteration is added to this one's data
        chk = Check(dtype, tol)
        recv = prep["recv"]
        if kind == "allgather":
            for r in range(self.n):
                chk.run(recv[r * c:(r + 1) * c], prep["pats"][r], 0)
        elif kind == "reduce_scatter":
            chk.run(recv, prep["expected"], self.rank * c, prep["scale"])
        else:
            chk.run(recv, prep["expected"], 0, prep["scale"])
        self.counts["checked_tolerance" if tol else "checked_exact"] += 1
        if tol:
            what = spec["op"] or kind  # the op of a reduction, else the kind
            if kind == "stream" and spec["error_feedback"]:
                what += f" ef x{spec['iterations']} iterations"
            ratio = chk.rel() / tol
            if ratio > self.max_rel.get(fam, (0.0,))[0]:
                self.max_rel[fam] = (ratio, chk.rel(), tol, f"{kind} {dtype} {what}, {c} elements")
        problem = chk.problem()
        if problem:
            self.wrong(f"{kind} result", j, spec, problem)
        if spec["check_send"] and not spec["inplace"]:
            sc = Check(dtype, 0.0)
            sc.run(prep["send"], prep["mine"], 0)
            if sc.problem():
                self.wrong(f"{kind} send buffer changed", j, spec, sc.problem())

    def replica_hash(self, prep):
        return int.from_bytes(hashlib.blake2b(prep["recv"].view(np.uint8).data,
                                              digest_size=8).digest(), "little", signed=True)

    def check_replicas(self, preps):
        """Lossy results of allreduce, allgather, broadcast and streams must be bit-identical on
        every rank (README: the owner keeps decode(encode(x))): an int64 allgather of hashes."""
        todo = [p for p in preps if p["lossy"] and p["spec"]["kind"] != "reduce_scatter"]
        if not todo:
            return
        k = len(todo)
        mine = np.array([self.replica_hash(p) for p in todo], dtype=np.int64)
        everyone = np.zeros(k * self.n, dtype=np.int64)
        self.where = f"iteration {self.it}: replica hashes"
        self.blocking_int_collective("allgather", mine, everyone, k, "int64")
        self.counts["replica_checks"] += k
        table = everyone.reshape(self.n, k)
        for i, p in enumerate(todo):
            if len(set(table[:, i].tolist())) != 1:
                self.wrong(f"{p['spec']['kind']} replicas differ", p["j"], p["spec"],
                           f"result hashes per rank {table[:, i].tolist()}")

    def run_stream(self, prep):
        spec = prep["spec"]
        dt, op = self.gs.DTYPES[spec["dtype"]], self.gs.OPS[spec["op"]]
        buf = prep["recv"]
        try:
            s = self.gs.GradientStream(self.comm, address(buf), spec["count"], dt, op,
                                       codec=spec["stream_codec"],
                                       error_feedback=spec["error_feedback"],
                                       bucket_bytes=spec["bucket_bytes"])
        except self.gs.GradstreamError as e:
            self.fatal(f"gs_stream_open: {e}", prep["j"], spec)
        try:
            for k in range(spec["iterations"]):
                if k:
                    fill(buf, prep["mine"], 0)  # next "gradient": the same contribution again
                ev, box, on_done = self.done_box()
                s.reduce(on_done)
                self.wait_all([(ev, box, prep["j"], spec)])
        except self.gs.GradstreamError as e:
            self.fatal(f"stream reduce: {e}", prep["j"], spec)
        finally:
            try:
                s.close()
            except self.gs.GradstreamError as e:
                self.fatal(f"gs_stream_close: {e}", prep["j"], spec)

    def iteration(self):
        plan = draw_iteration(self.seed, self.it, self.n)
        ops = plan["ops"] if plan["mode"] == "blocking" else fit_batch(plan["ops"], self.n)
        self.send_arena.reset()
        self.recv_arena.reset()
        t_start = time.monotonic()
        preps = [self.prepare(j, spec) for j, spec in enumerate(ops)]
        t_issue = time.monotonic()
        pending = []
        for i, prep in enumerate(preps):
            spec = prep["spec"]
            self.where = f"iteration {self.it} op {i}: {json.dumps(spec)}"
            blocking = plan["mode"] == "blocking" or (plan["end_blocking"] and i == len(preps) - 1)
            try:
                if spec["kind"] == "stream":
                    self.run_stream(prep)
                else:
                    ev, box, on_done = self.done_box()
                    self.issue(spec, address(prep["send"]), address(prep["recv"]), blocking,
                               on_done)
                    if blocking:
                        self.wait_all(pending + [(ev, box, i, spec)])  # already done: checks
                    else:
                        pending.append((ev, box, i, spec))
            except self.gs.GradstreamError as e:
                self.fatal(f"issuing {spec['kind']}: {e}", i, spec)
            self.counts[spec["kind"]] += 1
            self.counts["blocking" if blocking else "nonblocking"] += 1
            self.counts["inplace"] += spec["inplace"]
            self.counts["zero_count"] += spec["count"] == 0
            self.bytes_payload += payload_bytes(spec, self.n)
        self.where = f"iteration {self.it}: waiting for {len(pending)} requests"
        self.wait_all(pending)
        t_done = time.monotonic()
        for prep in preps:
            self.where = f"iteration {self.it} op {prep['j']}: checking"
            self.verify(prep)
        self.check_replicas(preps)
        self.progress = t_end = time.monotonic()
        # Where the time goes: the driver's fills and checks, or the library's collectives.
        self.seconds["prepare"] += t_issue - t_start
        self.seconds["collectives"] += t_done - t_issue
        self.seconds["check"] += t_end - t_done
        if t_done - t_issue > self.slowest[0]:
            self.slowest = (round(t_done - t_issue, 3), self.it,
                            [f"{p['spec']['kind']} {p['spec']['dtype']} "
                             f"{payload_bytes(p['spec'], self.n)} B" for p in preps])

    # -- control --------------------------------------------------------------------------------
    def control(self, stop_at):
        """Rank 0's decision, broadcast: 0 continue, 1 new communicator, 2 stop."""
        msg = np.zeros(2, dtype=np.int64)
        if self.rank == 0:
            now = time.monotonic()
            if now - getattr(self, "last_note", 0.0) >= self.args.interval:
                self.last_note = now
                done = sum(self.counts[k] for k in KINDS)
                log(f"iteration {self.it}: {done} collectives, "
                    f"{self.bytes_payload / 2**30:.2f} GiB of buffers, {self.failures} failures")
            if stop_at is not None and self.it >= stop_at:
                msg[0] = 2
            elif stop_at is None and now - self.args.start_mono >= self.args.duration:
                msg[0] = 2
            elif stop_at is None and now - self.comm_born >= self.lifetime:
                msg[0] = 1
        out = np.zeros(2, dtype=np.int64)
        self.where = f"iteration {self.it}: control broadcast"
        self.blocking_int_collective("broadcast", msg, out, 2, "int64", root=0)
        return int(out[0])

    def renew(self):
        epoch = self.epoch + 1
        self.close_comm()
        self.boundary("between")
        self.where = f"iteration {self.it}: waiting for the unique id of communicator {epoch}"
        self.open_comm(epoch, self.publish_uid(epoch))

    def watchdog(self):
        """No progress for the deadline plus a margin: say where, dump the stacks, exit."""
        while True:
            time.sleep(5)
            idle = time.monotonic() - self.progress
            limit = (self.deadline_s() if self.comm_opts else 120) + 60
            if idle > limit:
                log(f"rank {self.rank}: HANG: no progress for {idle:.0f} s in {self.where} "
                    f"(seed {self.seed} epoch {self.epoch} iter {self.it})")
                self.record(type="failure", what=f"hang in {self.where}", fatal=True,
                            **self.context())
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    def run(self):
        threading.Thread(target=self.watchdog, daemon=True).start()
        self.boundary("start")
        replay = self.args.replay
        if replay:
            epoch, first, last = replay
            self.it = first
            self.open_comm(epoch, self.publish_uid(epoch))
            stop_at = last
        else:
            self.open_comm(0, self.publish_uid(0))
            stop_at = None
        while True:
            self.progress = time.monotonic()
            self.where = f"iteration {self.it}"
            self.iteration()
            self.it += 1
            if self.it % CONTROL_EVERY == 0 or (stop_at is not None and self.it > stop_at):
                action = self.control(None if stop_at is None else stop_at + 1)
                if action == 2:
                    break
                if action == 1:
                    self.renew()
        self.close_comm()
        self.boundary("end")

    def summary(self, status):
        return {"rank": self.rank, "status": status, "iterations": self.it,
                "counts": self.counts, "bytes_payload": self.bytes_payload,
                "lib_bytes_logical": self.lib_bytes_logical,
                "lib_bytes_wire": self.lib_bytes_wire, "comms_created": self.comms_created,
                "failures": self.failures, "max_rel": self.max_rel,
                "transports": self.transports, "seed": self.seed,
                "seconds": self.seconds, "slowest": self.slowest,
                "version": self.gs.__version__, "library": self.gs.library_path,
                "env_codec": self.env_codec}


def rank_main(args):
    faulthandler.enable()
    with open(os.path.join(args.dir, f"rank{args.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    rank = Rank(args)
    status = "ok"
    try:
        rank.run()
    except Fatal:
        status = "fatal"
    except Exception as e:  # a bug of this driver or an unexpected library exception
        import traceback
        traceback.print_exc()
        rank.failures += 1
        rank.record(type="failure", what=f"exception {e!r} in {rank.where}", fatal=True,
                    **rank.context())
        status = "exception"
    with open(os.path.join(args.dir, f"rank{args.rank}.json"), "w") as f:
        json.dump(rank.summary(status), f)
    rank.out.close()
    sys.stderr.flush()
    if status != "ok":
        # The communicator is broken and peers may be gone: do not wait in atexit's destroy.
        os._exit(2)
    return 0 if rank.failures == 0 else 1
