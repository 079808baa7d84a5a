#!/usr/bin/env python3
"""Fails when a library source includes a header against the layering (docs/ARCHITECTURE.md):

    common <- transport <- stream <- control <- capi
    common <- format <- codecs <- stream    kernels only behind codecs
              format <- kernels             (the wire format and block math both sides share)
    common <- schedules <- stream       (control includes schedules too; tools/sim only them)
    common <- monitoring                (stream updates monitoring's counters; control reads them)

Inside transport/, a backend (tcp, shm, verbs, loopback) includes the shared transport headers
(transport/*.h) and its own, never another backend's; only the factory (transport/registry.cc)
sees them all. Outside transport/, only transport/*.h is visible.

KNOWN lists today's exceptions, each to be removed by the change that fixes it: a new include
against the direction fails, and so does an exception that no longer occurs (the list must
shrink with the code). Run by .ci/run:  python3 scripts/check_layers.py [repository root]
"""
import pathlib
import re
import sys

# module -> modules it may include (itself, "gradstream" (the public headers) always allowed)
ALLOWED = {
    "common": set(),
    "monitoring": {"common"},
    "transport": {"common"},
    "format": {"common"},
    "kernels": {"common", "format"},
    "codecs": {"common", "format", "kernels"},
    "schedules": {"common"},
    "stream": {"common", "transport", "format", "codecs", "schedules", "monitoring"},
    "control": {"common", "transport", "codecs", "schedules", "stream", "monitoring"},
    "capi": {"common", "control"},
}
BACKENDS = {"tcp", "shm", "verbs", "loopback"}
FACTORY = "transport/registry.cc"

# (file, included header): exceptions in today's code, each with why it is still here. None
# today: the kernels -> codecs includes went with the wire format's move to format/.
KNOWN = set()

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"')
SOURCES = (".h", ".cc", ".cu", ".cuh", ".inc")


def violations(root):
    found = set()
    for module in ALLOWED:
        for path in sorted((root / module).rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            parts = rel.split("/")
            backend = parts[1] if module == "transport" and len(parts) > 2 else None
            for line in path.read_text(errors="replace").splitlines():
                m = INCLUDE.match(line)
                if not m:
                    continue
                target, rest = m.group(1), m.group(2)
                header = f"{target}/{rest}"
                if target == "gradstream" or target not in ALLOWED:
                    continue  # public headers; third-party or generated paths
                if target != module and target not in ALLOWED[module]:
                    found.add((rel, header))
                    continue
                if target != "transport" or rel == FACTORY:
                    continue
                sub = rest.split("/")[0] if "/" in rest else None
                if sub in BACKENDS and sub != backend:
                    found.add((rel, header))  # another backend's private header
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    found = violations(root.resolve())
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    for rel, header in new:
        print(f"check_layers: {rel} includes {header}, against the layering (docs/ARCHITECTURE.md)")
    for rel, header in gone:
        print(f"check_layers: {rel} no longer includes {header}: remove it from KNOWN")
    if new or gone:
        return 1
    print(f"check_layers: ok ({len(KNOWN)} known exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
