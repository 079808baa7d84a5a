"""The soak's sampler (bench/soak.py monitor): every rank's VmRSS, open fds, threads and
/dev/shm segments into DIR/samples.csv until SIGTERM."""
import csv
import os
import signal
import threading
import time

from soak_proc import proc_sample


# ---------------------------------------------------------------------------------------------
# The sampler.

def monitor_main(args):
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pids = {}
    path = os.path.join(args.dir, "samples.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        head = ["t_s"]
        for r in range(args.ranks):
            head += [f"rss{r}_kib", f"fds{r}", f"threads{r}", f"shm{r}"]
        w.writerow(head)
        next_t = time.monotonic()
        while not stop.is_set():
            for r in range(args.ranks):
                if r not in pids:
                    try:
                        with open(os.path.join(args.dir, f"rank{r}.pid")) as p:
                            pids[r] = int(p.read())
                    except (FileNotFoundError, ValueError):
                        pass
            if len(pids) == args.ranks:
                row = [round(time.time() - args.t0, 1)]
                alive = 0
                for r in range(args.ranks):
                    try:
                        row += list(proc_sample(pids[r]))
                        alive += 1
                    except (FileNotFoundError, ProcessLookupError):
                        row += ["", "", "", ""]
                if alive == 0:
                    break
                w.writerow(row)
                f.flush()
                next_t += args.interval
            else:
                next_t = time.monotonic() + 0.2  # ranks still starting
            stop.wait(max(0.0, next_t - time.monotonic()))
    return 0
