"""What the soak reads of a process from /proc (bench/soak.py): memory, fds, threads and
/dev/shm segments, sampled by each rank at communicator boundaries and by the monitor."""
import ctypes
import os


def proc_sample(pid="self"):
    """(VmRSS KiB, open fds, threads, /dev/shm segments named gs-<pid>-*) of a process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = len(os.listdir(f"/proc/{pid}/task"))
    real = os.getpid() if pid == "self" else int(pid)
    try:
        segs = sum(1 for n in os.listdir("/dev/shm") if n.startswith(f"gs-{real}-"))
    except OSError:
        segs = -1
    return rss, fds, threads, segs


try:
    malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc
    malloc_trim.argtypes = [ctypes.c_size_t]
except (OSError, AttributeError):
    malloc_trim = None


def fd_kinds():
    """What this process's fds are ("socket", "anon_inode:[eventfd]", "/dev/shm/...": counts),
    so a boundary record shows what a growing count is made of."""
    kinds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":[")[0] if target.startswith(("socket:", "pipe:")) else target
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds
