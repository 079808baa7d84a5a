#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs a 2-rank and a 4-rank float32
# allreduce sweep through gradstream-perf on this machine (ranks of one host: shared memory),
# with result checks, then the same through PyTorch (torchrun, backend "gradstream").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${GS_BUILD_DIR:-$root/build}
for n in 2 4; do
  echo "== allreduce, float32, $n ranks (processes of this host; the # transport line says what carried them)"
  "$build/tools/gradstream-perf" --ranks "$n" -b 8 -e 64M -f 4 -n 10 -w 3 -c 1 --timeout 600
done
echo "== the same through PyTorch: torchrun, 2 processes, backend \"gradstream\""
PYTHONPATH="$build/python" timeout 300 "${GS_PYTHON:-python3}" -m torch.distributed.run \
  --standalone --nproc-per-node 2 "$root/examples/torch_allreduce.py"
