#!/usr/bin/env python3
"""Soak driver for bench/soak.sh: random collectives on N ranks, every result checked.

Three roles (bench/soak.sh starts them; see bench/README.md "Soak"):

  soak.py rank --rank R --ranks N --seed S --duration SECONDS --dir DIR
      one rank. Iteration i draws its collectives from (seed, i) alone and communicator e its
      options from (seed, e) alone, so every rank issues the same calls in the same order and a
      failure names what reproduces it (--replay E:I0:I1). Rank 0 alone looks at the clock and
      tells the others, over the communicator, when to start a new communicator or stop; it
      hands each communicator's unique id to the others in a file in DIR.
  soak.py monitor --dir DIR --ranks N --interval 10
      samples VmRSS, open fds, threads and /dev/shm segments of every rank from /proc into
      DIR/samples.csv until SIGTERM.
  soak.py report --dir DIR --ranks N --duration SECONDS
      the table, the figures and the verdict (exit 1 on failure).

Only numpy and the gradstream package (its ctypes layer) are used.
"""
# The roles live beside this file (the docstring above is --help): soak_rank.py, with the draws
# (soak_draw.py), the contributions and checks (soak_data.py) and the /proc samples
# (soak_proc.py); soak_monitor.py; soak_report.py.
import argparse
import sys
import time

import soak_rank
from soak_monitor import monitor_main
from soak_rank import rank_main
from soak_report import report_main


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="role", required=True)
    a = sub.add_parser("rank")
    a.add_argument("--rank", type=int, required=True)
    a.add_argument("--replay", help="EPOCH:FIRST_ITER:LAST_ITER: communicator EPOCH's options, "
                   "iterations FIRST..LAST only")
    for q in (a, sub.add_parser("monitor"), sub.add_parser("report")):
        q.add_argument("--ranks", type=int, default=4)
        q.add_argument("--dir", required=True)
        q.add_argument("--t0", type=float, default=None, help="start (time.time()) of the run")
        q.add_argument("--seed", type=int, default=1)
        q.add_argument("--duration", type=float, default=600)
        q.add_argument("--interval", type=float, default=10)
        q.add_argument("--warmup", type=float, default=None)
    args = p.parse_args()
    if args.t0 is None:
        args.t0 = time.time()
    soak_rank.T0 = args.t0  # log()'s zero: the run's start, the same on every rank
    if args.role == "rank":
        args.start_mono = time.monotonic()
        if args.replay:
            e, i0, i1 = (int(x) for x in args.replay.split(":"))
            args.replay = (e, i0, i1)
        return rank_main(args)
    if args.role == "monitor":
        return monitor_main(args)
    return report_main(args)


if __name__ == "__main__":
    sys.exit(main())
