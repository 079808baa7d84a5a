#!/usr/bin/env bash
# A real Prometheus server scrapes two gradstream ranks on 127.0.0.1 (scrape interval 1 s);
# then its HTTP API must show the byte counters, the goodput gauge and the codec label with
# plausible values for both ranks.
#
# usage: prometheus_e2e.sh perf    <gradstream-perf>     2-rank allreduce run, ~10 s
#        prometheus_e2e.sh fixture <gs-metrics-fixture>  two synthetic exporters (no engine)
# Env: GS_E2E_ITERS (perf iterations at 64 MiB, default 250: ~10 s here), GS_E2E_KEEP=1 keeps the temp dir.
# Exit 77 (ctest: skipped) when prometheus or python3 is missing or the build has no exporter.
# Bounded: Prometheus gets 20 s to be ready and 30 s to begin scraping (about 6 s here), the
# workload 60 s (about 10 s), ctest 90 s for the whole; everything started is killed on exit.
set -euo pipefail
mode=${1:?mode perf|fixture}
exe=${2:?executable}

for tool in prometheus python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not found (Debian: apt-get install prometheus python3)"
    exit 77
  fi
done
if [[ ${GS_HAVE_PROMETHEUS:-1} == 0 ]]; then
  echo "SKIP: built without prometheus-cpp (GS_WITH_PROMETHEUS), nothing to scrape"
  exit 77
fi
[[ -x $exe ]] || { echo "FAIL: $exe is not built"; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ ${GS_E2E_KEEP:-0} == 1 ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

# Two consecutive free ports for the ranks (base + local rank) and one for Prometheus.
read -r base pport < <(python3 - <<'PY'
import socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]; s.close()
    if base < 65000 and free(base + 1):
        break
s = socket.socket(); s.bind(("127.0.0.1", 0)); pp = s.getsockname()[1]; s.close()
print(base, pp)
PY
)
echo "ranks export on 127.0.0.1:$base and :$((base + 1)); prometheus on 127.0.0.1:$pport"

cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: gs
    static_configs:
      - targets: ['127.0.0.1:$base', '127.0.0.1:$((base + 1))']
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
pids+=($!)
prom_pid=$!
for i in $(seq 100); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$pport/-/ready', timeout=1)" 2>/dev/null; then
    break
  fi
  kill -0 "$prom_pid" 2>/dev/null || { cat "$tmp/prometheus.log"; echo "FAIL: prometheus exited"; exit 1; }
  [[ $i == 100 ]] && { cat "$tmp/prometheus.log"; echo "FAIL: prometheus not ready in 20 s"; exit 1; }
  sleep 0.2
done
ready_at=$(date +%s)

# Prometheus applies new targets to its scrape manager only every 5 s, so the first scrapes come
# seconds after /-/ready. A ~7 s workload started at once was scraped in its last second or two
# only, and once (CI, 2 cores) a rank had a single sample: no rate. Scraping begins before the
# ranks do: both targets must show an `up` series (0 while nothing listens yet) first.
for i in $(seq 150); do
  n=$(python3 - "$pport" <<'PY' 2>/dev/null || echo 0
import json, sys, urllib.parse, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/api/v1/query?" + urllib.parse.urlencode({"query": 'up{job="gs"}'})
print(len(json.load(urllib.request.urlopen(url, timeout=1))["data"]["result"]))
PY
)
  [[ $n == 2 ]] && break
  [[ $i == 150 ]] && { cat "$tmp/prometheus.log"; echo "FAIL: prometheus did not scrape both targets in 30 s"; exit 1; }
  sleep 0.2
done
echo "prometheus scrapes both targets after $(($(date +%s) - ready_at))s"

start=$(date +%s)
if [[ $mode == perf ]]; then
  iters=${GS_E2E_ITERS:-250}
  echo "running: GS_SHM=0 GS_METRICS_ADDR=127.0.0.1:$base $exe --ranks 2 -b 64M -e 64M -n $iters -w 2 -c 0"
  # Over tcp (GS_SHM=0), as the iteration count was sized for: over shared memory the run is
  # about twice as fast and may end before Prometheus's first scrape (its scrape manager takes
  # a few seconds to start on new targets).
  GS_SHM=0 GS_METRICS_ADDR=127.0.0.1:$base timeout 60 "$exe" --ranks 2 -b 64M -e 64M -n "$iters" -w 2 -c 0 \
    >"$tmp/workload.log" 2>&1 &
  pids+=($!)
  workload=($!)
else
  for r in 0 1; do
    timeout 60 "$exe" --addr "127.0.0.1:$base" --local-rank $r --rank $r --seconds 10 \
      >"$tmp/workload$r.log" 2>&1 &
    pids+=($!)
    workload+=($!)
  done
fi
rc=0
for p in "${workload[@]}"; do wait "$p" || rc=$?; done
elapsed=$(($(date +%s) - start))
cat "$tmp"/workload*.log | tail -15
if [[ $rc != 0 ]]; then
  echo "FAIL: workload exited with $rc after ${elapsed}s"
  exit 1
fi
echo "workload ran ${elapsed}s"
sleep 1

# Query the HTTP API. max_over_time: the ranks exited, so instant values are stale by now.
python3 - "$pport" "$mode" <<'PY'
import json, sys, urllib.parse, urllib.request
port, mode = sys.argv[1], sys.argv[2]
def query(q):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    r = json.load(urllib.request.urlopen(url, timeout=5))
    assert r["status"] == "success", r
    return [(s["metric"], float(s["value"][1])) for s in r["data"]["result"]]
fails = []
def check(q, lo, hi, want_series=2, by="rank"):
    res = query(q)
    print(f"{q}:")
    for m, v in res:
        print(f"    {by}={m.get(by)} peer={m.get('peer')} -> {v:.6g}")
    if len(res) < want_series:
        fails.append(f"{q}: {len(res)} series, expected {want_series}")
    for m, v in res:
        if not lo <= v <= hi:
            fails.append(f"{q}: {by}={m.get(by)} value {v:.6g} outside [{lo:.3g}, {hi:.3g}]")
    return res
up = check('max_over_time(up{job="gs"}[5m])', 1, 1, by="instance")
MiB = 1 << 20
# perf: each rank sends >= 64 MiB per 2-rank allreduce iteration (ring: 2(N-1)/N x size).
min_bytes = 64 * MiB * 10 if mode == "perf" else 10 * MiB
check("max_over_time(gs_bytes_wire_total[5m])", min_bytes, 1e14)
check("max_over_time(gs_bytes_logical_total[5m])", min_bytes * 0.5, 1e14)
check("max_over_time(gs_link_goodput_bytes_per_second[5m])", 1e6, 1e12)
check('max_over_time(gs_chunks_total{codec="raw"}[5m])', 10, 1e12)
ranks = {m["rank"] for m, _ in query("max_over_time(gs_bytes_wire_total[5m])")}
if ranks != {"0", "1"}:
    fails.append(f"rank labels {sorted(ranks)}, expected ['0', '1']")
# Each rank was scraped during its run more than once (scraping began before the ranks), and the
# counters were seen moving: a rate over a window spanning the whole ~7 s run.
check("count_over_time(gs_bytes_wire_total[5m])", 2, 1e6)
check("max_over_time(rate(gs_bytes_wire_total[10s])[5m:1s])", 1e5, 1e12)
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
PY
echo "PASS"
