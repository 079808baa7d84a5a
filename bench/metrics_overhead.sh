#!/usr/bin/env bash
# Cost of metrics on the data path: gradstream-perf --ranks 2 at 64 MiB with the Prometheus
# exporter on (GS_METRICS_ADDR set, and a scraper polling /metrics every 200 ms to include
# scrape cost) and off, in alternating runs so machine noise hits both alike. Prints the busbw of
# each run, the medians and the difference in %. Target: under 2 %.
#
#   bench/metrics_overhead.sh [-p PAIRS] [-n ITERS] [-w WARMUP] [-s SIZE] [--ranks N]
#     -p PAIRS   on/off pairs (default 5)     -n / -w   iterations / warm-up per run (20 / 3)
#     -s SIZE    message size (default 64M)   --ranks N (default 2)
#   GS_PERF=path     gradstream-perf (default build/tools/gradstream-perf); GS_PERF_ARGS=extra flags
#   GS_METRICS_PORT  base port of the exporter (default 19400; ranks use base + local rank)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
gs_perf=${GS_PERF:-$root/build/tools/gradstream-perf}
pairs=5 iters=20 warmup=3 size=64M ranks=2
port=${GS_METRICS_PORT:-19400}

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while (($#)); do
  case $1 in
    -p) pairs=$2 ;;
    -n) iters=$2 ;;
    -w) warmup=$2 ;;
    -s) size=$2 ;;
    --ranks) ranks=$2 ;;
    -h | --help) usage 0 ;;
    *) usage ;;
  esac
  shift 2
done
[[ -x $gs_perf ]] || { echo "metrics_overhead: $gs_perf not found (build first, or set GS_PERF)"; exit 1; }

scraper_pid=
cleanup() { [[ -n $scraper_pid ]] && kill "$scraper_pid" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

# Polls every rank's /metrics every 200 ms (a Prometheus at 1 s is gentler than this).
start_scraper() {
  python3 - "$port" "$ranks" <<'PY' &
import sys, time, urllib.request
port, ranks = int(sys.argv[1]), int(sys.argv[2])
while True:
    for r in range(ranks):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port + r}/metrics", timeout=1).read()
        except Exception:
            pass
    time.sleep(0.2)
PY
  scraper_pid=$!
}

# One run; prints its busbw (GB/s) or "fail".
run() {
  local out
  if [[ $1 == on ]]; then
    out=$(GS_METRICS_ADDR=127.0.0.1:$port timeout 300 "$gs_perf" --ranks "$ranks" -b "$size" \
          -e "$size" -n "$iters" -w "$warmup" -c 0 ${GS_PERF_ARGS:-} 2>&1)
  else
    out=$(env -u GS_METRICS_ADDR timeout 300 "$gs_perf" --ranks "$ranks" -b "$size" -e "$size" \
          -n "$iters" -w "$warmup" -c 0 ${GS_PERF_ARGS:-} 2>&1)
  fi
  # Data row: size count type redop root time algbw busbw #wrong
  awk '!/^#/ && NF >= 9 && $1 ~ /^[0-9]+$/ { bw = $8 } END { if (bw == "") print "fail"; else print bw }' <<<"$out"
}

command -v python3 >/dev/null && start_scraper
echo "# metrics overhead: gradstream-perf --ranks $ranks, $size, $iters iterations ($warmup warm-up), $pairs pairs"
echo "# exporter on 127.0.0.1:$port+local rank, scraped every 200 ms; busbw in GB/s"
printf '%-6s %12s %12s\n' pair off on
on_vals=() off_vals=()
for ((i = 1; i <= pairs; i++)); do
  # Alternate which goes first so drift over time does not favour one side.
  if ((i % 2)); then off=$(run off); on=$(run on); else on=$(run on); off=$(run off); fi
  printf '%-6s %12s %12s\n' "$i" "$off" "$on"
  [[ $off != fail ]] && off_vals+=("$off")
  [[ $on != fail ]] && on_vals+=("$on")
done
if ((${#on_vals[@]} == 0 || ${#off_vals[@]} == 0)); then
  echo "metrics_overhead: runs failed"; exit 1
fi
python3 - "${off_vals[*]}" "${on_vals[*]}" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]
on = [float(x) for x in sys.argv[2].split()]
mo, mn = statistics.median(off), statistics.median(on)
diff = (mn - mo) / mo * 100
print(f"median busbw off {mo:.3f} GB/s  on {mn:.3f} GB/s  difference {diff:+.2f} %  "
      f"(spread off {min(off):.3f}-{max(off):.3f}, on {min(on):.3f}-{max(on):.3f})")
print("within the 2 % target" if abs(diff) < 2 else "OUTSIDE the 2 % target (or noise: raise -p)")
PY
