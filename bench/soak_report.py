"""The soak's report (bench/soak.py report): the table, the figures and the verdict."""
import csv
import json
import os

from soak_draw import KINDS


# ---------------------------------------------------------------------------------------------
# The report.

def growth(series, warmup, end, slack_frac, slack_kib):
    """(first-third max, last-third max, verdict) of [(t, value)] after warm-up; verdict None when
    a third holds fewer than 2 points (too short to judge)."""
    pts = [(t, v) for t, v in series if t >= warmup]
    if not pts:
        return None, None, None
    span = max(end - warmup, 1e-9)
    first = [v for t, v in pts if t < warmup + span / 3]
    last = [v for t, v in pts if t >= warmup + 2 * span / 3]
    if len(first) < 2 or len(last) < 2:
        return (max(first) if first else None), (max(last) if last else None), None
    a, b = max(first), max(last)
    return a, b, b <= a * (1 + slack_frac) + slack_kib


def report_main(args):
    n, d = args.ranks, args.dir
    slack_frac, slack_kib = 0.10, 16 * 1024
    failed = []
    summaries = {}
    codes = {}
    try:
        with open(os.path.join(d, "exit_codes")) as f:
            for line in f:
                r, c = line.split()
                codes[int(r)] = int(c)
    except FileNotFoundError:
        pass
    for r in range(n):
        try:
            with open(os.path.join(d, f"rank{r}.json")) as f:
                summaries[r] = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            if codes.get(r, 0) in (0, 1):  # a killed rank's status says it already
                failed.append(f"rank {r} wrote no summary (see its log)")
    meaning = {1: "wrong results", 2: "a collective failed", 3: "hang (watchdog)",
               124: "ran past its timeout", 137: "SIGKILL", 143: "SIGTERM (ended by soak.sh "
               "after another rank failed, or from outside)"}
    for r, c in sorted(codes.items()):
        if c != 0:
            failed.append(f"rank {r} exited with status {c} ({meaning.get(c, 'see its log')})")
    records = {r: [] for r in range(n)}
    for r in range(n):
        try:
            with open(os.path.join(d, f"rank{r}.jsonl")) as f:
                records[r] = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            pass
    bad = [(r, e) for r in range(n) for e in records[r] if e["type"] == "failure"]
    if bad:
        failed.append(f"{len(bad)} failure records (wrong results, failed or hung collectives)")
    rows = []
    try:
        with open(os.path.join(d, "samples.csv")) as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        pass

    duration = args.duration
    end = max([float(x["t_s"]) for x in rows] + [e["t"] for r in records for e in records[r]]
              + [0.0])
    warmup = args.warmup if args.warmup is not None else min(60.0, duration / 4)

    print(f"\n# samples every {args.interval:g} s (RSS MiB / open fds / threads per rank); "
          f"warm-up {warmup:g} s")
    head = f"{'t_s':>7}" + "".join(f" | r{r} rss  fds thr" for r in range(n))
    print(head)
    for x in rows:
        line = f"{float(x['t_s']):7.1f}"
        for r in range(n):
            if x[f"rss{r}_kib"] == "":
                line += " |    -    -   -"
            else:
                line += f" | {int(x[f'rss{r}_kib']) / 1024:6.1f} {int(x[f'fds{r}']):4d} " \
                        f"{int(x[f'threads{r}']):3d}"
        print(line)

    # Growth after warm-up, max of the first third against max of the last third:
    #  - RSS within x 1.10 + 16 MiB, in the 10 s samples and in each rank's own samples taken
    #    between communicators;
    #  - fds, threads and /dev/shm segments not above at all, in the samples between
    #    communicators (nothing of the library alive, so the count is the same every time);
    #    in the 10 s samples they depend on the live communicator's options (tcp sockets per
    #    peer, shm or not), so there they are shown, not judged.
    print("\n# growth after warm-up: max of the first third -> max of the last third "
          "(RSS bound x1.10 + 16 MiB; fds, threads, shm segments between communicators: none)")
    judged = False
    for r in range(n):
        def series(key, src):
            if src == "10s":
                return [(float(x["t_s"]), int(x[key.format(r)])) for x in rows
                        if x[key.format(r)] != ""]
            return [(e["t"], e[key]) for e in records[r]
                    if e["type"] == "boundary" and e["label"] == "between"]
        checks = [("10s", "rss{}_kib", True, True), ("10s", "fds{}", False, False),
                  ("10s", "threads{}", False, False),
                  ("between", "rss_kib", True, True), ("between", "fds", False, True),
                  ("between", "threads", False, True), ("between", "shm_segments", False, True)]
        parts = []
        for src, key, is_rss, judge in checks:
            a, b, ok = growth(series(key, src), warmup, end,
                              slack_frac if is_rss else 0.0, slack_kib if is_rss else 0)
            name = f"{src} {key.replace('{}', '').replace('_kib', '')}"
            if a is None:
                parts.append(f"{name} -")
                continue
            fmt = (lambda v: f"{v / 1024:.1f}M") if is_rss else (lambda v: str(v))
            if not judge:
                verdict = ""
            else:
                verdict = "" if ok else (" (too short to judge)" if ok is None else " GREW")
            parts.append(f"{name} {fmt(a)}->{fmt(b) if b is not None else '-'}{verdict}")
            if judge and ok is not None:
                judged = True
            if judge and ok is False:
                failed.append(f"rank {r}: {name} grew after warm-up: {fmt(a)} -> {fmt(b)}")
        print(f"rank {r}: " + ", ".join(parts))
    if not judged:
        print("(the run is too short to judge growth: each third after warm-up needs 2 samples)")

    # Figures.
    if summaries:
        s0 = summaries[min(summaries)]
        kinds = {k: s0["counts"][k] for k in KINDS}
        total = sum(kinds.values())
        c = s0["counts"]
        print("\n# figures (rank 0's counts; every rank issues the same calls)")
        print(f"library {s0['version']} ({s0['library']}), seed {s0['seed']}"
              + (f", GS_CODEC={s0['env_codec']} for every communicator" if s0["env_codec"]
                 else ""))
        print(f"iterations {s0['iterations']}, collectives {total} ("
              + ", ".join(f"{k} {v}" for k, v in kinds.items())
              + f"), blocking {c['blocking']} / non-blocking {c['nonblocking']}, in place "
              f"{c['inplace']}, count 0: {c['zero_count']}; checked exactly {c['checked_exact']},"
              f" within codec bounds {c['checked_tolerance']}, replica hash checks "
              f"{c['replica_checks']}; control collectives {c['control']}")
        pay = sum(s["bytes_payload"] for s in summaries.values())
        logical = sum(s["lib_bytes_logical"] for s in summaries.values())
        wire = sum(s["lib_bytes_wire"] for s in summaries.values())
        print(f"bytes: buffers {pay / 2**30:.2f} GiB over all ranks; the library's "
              f"bytes_logical {logical / 2**30:.2f} GiB, bytes_wire {wire / 2**30:.2f} GiB")
        print(f"communicators created {s0['comms_created']} per rank, transports "
              + ", ".join(f"{k} x{v}" for k, v in sorted(s0["transports"].items())))
        sec = s0["seconds"]
        slow = s0["slowest"]
        print(f"rank 0's time: fills {sec['prepare']:.1f} s, collectives (issue to completion) "
              f"{sec['collectives']:.1f} s, checks {sec['check']:.1f} s; slowest iteration "
              f"{slow[1]} ({slow[0]:.2f} s of collectives: {', '.join(slow[2])})")
        rel = {}
        for s in summaries.values():
            for k, v in s["max_rel"].items():
                rel[k] = max(rel.get(k, (0.0,)), tuple(v))
        if rel:
            print("closest to its bound, per codec: relative L2 error / bound (what): "
                  + "; ".join(f"{k} {v:.2g} / {b:.2g} ({w})"
                              for k, (_, v, b, w) in sorted(rel.items())))
        for r in range(n):
            b = [e for e in records[r] if e["type"] == "boundary"]
            if b:
                print(f"rank {r}: RSS {b[0]['rss_kib'] / 1024:.1f} -> {b[-1]['rss_kib'] / 1024:.1f}"
                      f" MiB, fds {b[0]['fds']} -> {b[-1]['fds']}, threads {b[0]['threads']} -> "
                      f"{b[-1]['threads']} (start -> {b[-1]['label']}, no communicator alive)")
    for r, e in bad[:20]:
        print(f"FAILURE rank {r}: {e['what']}" + (f": {e['detail']}" if e.get("detail") else "")
              + f" (seed {e['seed']} epoch {e['epoch']} iter {e['iter']}"
              + (f" op {e['op']} spec {json.dumps(e['spec'])}" if "op" in e else "")
              + f" comm {json.dumps(e['comm'])})")
    if failed:
        print("\nsoak: FAIL: " + "; ".join(dict.fromkeys(failed)))
        return 1
    print("\nsoak: PASS: every result right, no failure"
          + (", no growth after warm-up" if judged else " (growth not judged: too short)"))
    return 0
