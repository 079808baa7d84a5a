#!/usr/bin/env bash
# Checks deploy/ with the real tools. usage: check_deploy.sh <gs-metrics-fixture> <deploy dir>
# Exit 77 (ctest: skipped) when promtool or python3 is missing or the build has no exporter.
set -euo pipefail
fixture=$1
deploy=$2

for tool in promtool python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not found (Debian: apt-get install prometheus python3)"
    exit 77
  fi
done
if [[ ${GS_HAVE_PROMETHEUS:-1} == 0 ]]; then
  echo "SKIP: built without prometheus-cpp (GS_WITH_PROMETHEUS), no exporter to scrape"
  exit 77
fi

tmp=$(mktemp -d)
fixture_pid=
cleanup() {
  if [[ -n $fixture_pid ]]; then kill "$fixture_pid" 2>/dev/null || true; wait "$fixture_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== promtool check config"
promtool check config "$deploy/prometheus.yml"
echo "== promtool check rules"
promtool check rules "$deploy/alerts.yml"
echo "== promtool test rules"
(cd "$deploy" && promtool test rules alerts_test.yml)

echo "== scrape a live exporter"
"$fixture" --addr 127.0.0.1:0 --seconds 20 >"$tmp/fixture.out" 2>"$tmp/fixture.err" &
fixture_pid=$!
for _ in $(seq 100); do
  grep -q '^address ' "$tmp/fixture.out" 2>/dev/null && break
  kill -0 "$fixture_pid" 2>/dev/null || { cat "$tmp/fixture.err"; exit 1; }
  sleep 0.05
done
addr=$(sed -n 's/^address //p' "$tmp/fixture.out")
[[ -n $addr ]] || { echo "fixture printed no address"; cat "$tmp/fixture.err"; exit 1; }
sleep 0.3
python3 - "$addr" "$tmp/scrape.txt" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read()
open(sys.argv[2], "wb").write(body)
PY
echo "scraped $(grep -c '^gs_' "$tmp/scrape.txt") gs_ samples from $addr"

echo "== promtool check metrics"
# promtool lints: wrong suffixes, missing help, invalid exposition. Exporter-internal
# (exposer_*) families come from prometheus-cpp and are checked too.
if ! promtool check metrics <"$tmp/scrape.txt" >"$tmp/lint.txt" 2>&1; then
  cat "$tmp/lint.txt"
  echo "FAIL: promtool check metrics"
  exit 1
fi
cat "$tmp/lint.txt"

echo "== dashboard"
python3 "$(dirname "$0")/check_dashboard.py" "$deploy/grafana-dashboard.json" \
  "$tmp/scrape.txt" "$tmp/dashboard_rules.yml"
promtool check rules "$tmp/dashboard_rules.yml"
# The alert rules must name exported metrics too (up is Prometheus's own).
missing=0
for n in $(grep -o '\bgs_[a-z0-9_]*' "$deploy/alerts.yml" | sort -u); do
  if ! grep -q "^# TYPE ${n%_count} \|^# TYPE $n " "$tmp/scrape.txt"; then
    echo "alerts.yml: $n is not exported by gradstream"; missing=1
  fi
done
[[ $missing == 0 ]]
echo "PASS"
