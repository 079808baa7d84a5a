#!/usr/bin/env bash
# A host whose /dev/shm cannot hold its ranks' receive slots (a container's default 64 MiB, 4
# ranks whose schedules link every pair at 8 MiB a link and end): in a private mount namespace
# with a 64 MiB tmpfs on /dev/shm, 4 ranks of gradstream-perf must run every allreduce right
# (-c 1, every element) over tcp, each rank warning why; with 512 MiB there the same run must
# be over shm. Root only (exit 77 otherwise: mount namespaces); bounded by timeouts.
#   shm_full.sh PERF_EXE
set -uo pipefail
perf=${1:?usage: shm_full.sh PERF_EXE}
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root for a mount namespace"; exit 77; }
command -v unshare >/dev/null || { echo "SKIP: unshare missing"; exit 77; }
unshare -m true 2>/dev/null || { echo "SKIP: cannot create a mount namespace here"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # run SIZE LOG: 4 ranks under a /dev/shm of SIZE
  timeout -k 5 120 unshare -m sh -c "mount -t tmpfs -o size=$1 tmpfs /dev/shm &&
    GS_SHM=1 GS_TRANSPORT=tcp '$perf' --ranks 4 -b 8 -e 4M -f 32 -n 10 -w 2 -c 1" >"$2" 2>&1
}
failed=0
run 64m "$out/small.txt" || { echo "FAIL: 4 ranks under a 64 MiB /dev/shm exited $?"; failed=1; }
warnings=$(grep -c "shm links of host .* need .* MB of /dev/shm, .* MB are free: its ranks use tcp" \
  "$out/small.txt")
[[ $warnings == 4 ]] || { echo "FAIL: $warnings of 4 ranks said why shm was left out"; failed=1; }
grep -q "^# transport: tcp" "$out/small.txt" ||
  { echo "FAIL: under 64 MiB the links were not over tcp"; failed=1; }
run 512m "$out/large.txt" || { echo "FAIL: 4 ranks under a 512 MiB /dev/shm exited $?"; failed=1; }
grep -q "^# transport: shm$" "$out/large.txt" ||
  { echo "FAIL: under 512 MiB the links were not over shm"; failed=1; }
for f in small large; do
  # gradstream-perf's #wrong column (9th) counts mismatched elements; -c 1 checks every one.
  awk '/^ +[0-9]+ / && NF >= 10 && $9 != 0 { bad = 1 } END { exit bad }' "$out/$f.txt" ||
    { echo "FAIL: wrong results under the $f /dev/shm"; failed=1; }
done
if ((failed)); then
  echo "--- 64 MiB run"; cat "$out/small.txt"; echo "--- 512 MiB run"; cat "$out/large.txt"
  exit 1
fi
echo "PASS: 64 MiB /dev/shm: tcp with 4 warnings; 512 MiB: shm; every element right"
