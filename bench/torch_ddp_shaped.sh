#!/usr/bin/env bash
# DDP training step time where the network is the bottleneck: two ranks as hosts in network
# namespaces joined through a bridge (tests/congestion/testbed.sh, 198.19.1.0/24), both uplinks
# shaped with tbf to RATE, and the same on the unshaped veths; per link, back to back, DDP with
# backend gloo and with backend gradstream plus its comm hook (int8 + error feedback). Prints
# steps/s per variant, the ratio to gloo, and the loss after the run (same seed) with its
# relative difference to gloo's. Root only. See bench/README.md ("torch.distributed").
#
#   bench/torch_ddp_shaped.sh [options]
#     --rate RATE     tbf rate of each uplink, as tc writes it (default 1gbit)
#     --links "shaped unshaped"   which link settings (default both)
#     --variants "gloo gs_int8"   gloo: backend gloo, DDP's allreduce; gs: backend gradstream,
#                     no hook; gs_CODEC: gradstream hook with CODEC (raw bf16 int8 int4 auto) and
#                     error feedback; gs_CODEC_noef: the hook without it (default "gloo gs_int8")
#     --steps N --warmup N   timed / untimed steps per run (default 10 / 3)
#     --rounds N      run the variant list N times per link (default 1)
#     --args "..."    more flags for torch_ddp_step.py (--batch, --width, --layers, --lr, ...)
#     --results DIR   raw outputs (default build/bench/results/torch-ddp-<date>)
#     --timeout S     bound on each launch (default 300)
#   PYTHON=interpreter (default: python3's real executable); PYTHONPATH gets $root/build/python
#   in front (GS_PYTHONPATH=dir to use another build's package)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
source "$root/bench/ranks.sh"
rate=1gbit
links="shaped unshaped"
variants="gloo gs_int8"
steps=10 warmup=3 rounds=1 extra="" results="" limit=300

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while (($#)); do
  case $1 in
    --rate) rate=$2 ;;
    --links) links=$2 ;;
    --variants) variants=$2 ;;
    --steps) steps=$2 ;;
    --warmup) warmup=$2 ;;
    --rounds) rounds=$2 ;;
    --args) extra=$2 ;;
    --results) results=$2 ;;
    --timeout) limit=$2 ;;
    -h | --help) usage 0 ;;
    *) echo "torch_ddp_shaped.sh: unknown option $1" >&2; usage ;;
  esac
  shift 2 || usage
done
[[ $(id -u) == 0 ]] || { echo "torch_ddp_shaped.sh: needs root (network namespaces)"; exit 77; }
command -v ip > /dev/null && command -v tc > /dev/null || { echo "torch_ddp_shaped.sh: needs iproute2"; exit 77; }
results=${results:-$root/build/bench/results/torch-ddp-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$results" || exit 1
py=${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')} || exit 1
export PYTHONPATH=${GS_PYTHONPATH:-$root/build/python}${PYTHONPATH:+:$PYTHONPATH}
bench=$here/torch_ddp_step.py

# Flags of torch_ddp_step.py for a variant name ("" when the name is not one).
variant_flags() {
  case $1 in
    gloo) echo "--backend gloo" ;;
    gs) echo "--backend gradstream" ;;
    gs_*_noef) echo "--backend gradstream --hook-codec ${1#gs_} --ef 0" | sed 's/_noef / /' ;;
    gs_*) echo "--backend gradstream --hook-codec ${1#gs_} --ef 1" ;;
  esac
}
for v in $variants; do
  [[ -n $(variant_flags "$v") ]] || { echo "torch_ddp_shaped.sh: unknown variant $v" >&2; exit 2; }
done
if [[ " $variants " == *" gs"* ]] && ! timeout 60 "$py" -c 'import gradstream.torch' 2> "$results/import.err"; then
  echo "torch_ddp_shaped.sh: 'import gradstream.torch' fails (PYTHONPATH=$PYTHONPATH); gloo only:" >&2
  tail -3 "$results/import.err" | sed 's/^/    /' >&2
  variants=$(for v in $variants; do [[ $v == gs* ]] || echo "$v"; done)
fi
rm -f "$results/import.err"

# shellcheck source=../tests/congestion/testbed.sh
source "$root/tests/congestion/testbed.sh"
trap tb_cleanup EXIT
tb_setup 2 || { echo "torch_ddp_shaped.sh: cannot create namespaces" >&2; exit 1; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

# run NAME FLAGS...: rank r in host r, both bounded; rank 0's output in $results/NAME.txt, rank
# 1's in NAME.rank1.txt. Every link goes over the veths: each rank binds its rendezvous, Gloo
# and gradstream's tcp to its namespace's device, and GS_SHM=0 (besides the distinct host names
# tb_exec gives) keeps gradstream off shared memory.
run() {
  local name=$1 port=$((20000 + RANDOM % 20000)) r pids=() rc=0
  shift
  for r in 0 1; do
    tb_exec "$r" env RANK=$r WORLD_SIZE=2 MASTER_ADDR="$(tb_addr 0)" MASTER_PORT=$port \
      GLOO_SOCKET_IFNAME="$(tb_dev "$r")" GS_SOCKET_IFNAME="$(tb_dev "$r")" GS_SHM=0 \
      GS_SECRET="torch-ddp-$port" GS_TIMEOUT_MS=$((limit * 1000)) \
      timeout -k 5 "$limit" "$py" "$bench" --steps "$steps" --warmup "$warmup" --timeout "$limit" \
      --tag "$name" --save-update "$results/$name.update.pt" "$@" > "$results/$name$( ((r)) && echo .rank$r).txt" 2>&1 &
    pids+=($!)
  done
  wait_ranks "${pids[@]}" || rc=$?
  return $rc
}
# upd_diff A B: |update A - update B| / |update B| over the saved samples of the parameters'
# change ("-" when either is missing).
upd_diff() {
  [[ -f $1 && -f $2 ]] || { echo "-"; return; }
  timeout 60 "$py" -c 'import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
print(f"{float((a - b).norm() / b.norm()):.2e}" if a.shape == b.shape and b.norm() > 0 else "-")' "$1" "$2" 2> /dev/null || echo "-"
}
# field FILE KEY: value of KEY=... in the "# result" line ("-" if none).
field() {
  awk -v k="$2" '/^# result / { for (i = 3; i <= NF; i++) if (index($i, k "=") == 1) { print substr($i, length(k) + 2); f = 1; exit } }
    END { if (!f) print "-" }' "$1" 2> /dev/null || echo "-"
}

summary=$results/summary.txt
{
  echo "# torch_ddp_shaped.sh $(date -Is) on $(hostname), $(nproc) cores, $(uname -r)"
  echo "# 2 ranks, one per namespace host; DDP, $steps timed steps after $warmup; flags: ${extra:-(defaults)}"
  echo "# x_gloo = steps/s / gloo's steps/s in the same round; loss: MSE of rank 0's replica on all"
  echo "# training batches after the run (loss0 before it); rel_diff = (loss - gloo's) / gloo's;"
  echo "# drop_diff = (loss0 - loss) against gloo's, relative; upd_diff = |change of the parameters - gloo's| / |gloo's|"
  echo "# (every 97th element, rank 0); wire_ratio = logical / wire bytes of the training steps (gradstream)"
  echo "# load average at start: $(load)"
} | tee "$summary"

for link in $links; do
  case $link in
    shaped) tb_shape 0 "$rate" && tb_shape 1 "$rate" || { echo "tc tbf failed for $rate" >&2; exit 1; }
      label="tbf $rate on both uplinks" ;;
    unshaped) tb_unshape 0; tb_unshape 1; label="unshaped veth" ;;
    *) echo "torch_ddp_shaped.sh: --links takes shaped and/or unshaped, not $link" >&2; exit 2 ;;
  esac
  for ((round = 1; round <= rounds; round++)); do
    for v in $variants; do
      name=${link}_${v}_r$round t0=$SECONDS rc=0
      # shellcheck disable=SC2046,SC2086  # flag lists
      run "$name" $(variant_flags "$v") $extra || rc=$?
      printf '  %-24s %4ds  load %-16s %s\n' "$name" $((SECONDS - t0)) "$(load)" \
        "$( ((rc == 0)) && echo ok || echo "FAILED (rc $rc$( ((rc == 124)) && echo ": timed out"))")" >&2
      if ((rc)); then
        for f in "$results/$name.txt" "$results/$name.rank1.txt"; do
          grep -v '^#' "$f" | tail -4 | sed "s|^|    $(basename "$f"): |" >&2
        done
      fi
      echo "$(load)" > "$results/$name.load"
    done
  done
  {
    echo
    echo "## $label"
    printf '%-5s %-12s %9s %11s %10s %7s %12s %12s %10s %10s %9s %10s %10s\n' round variant steps/s step_med_ms \
      compute_ms x_gloo loss0 loss rel_diff drop_diff upd_diff wire_ratio load_after
    for ((round = 1; round <= rounds; round++)); do
      g=$results/${link}_gloo_r$round.txt
      for v in $variants; do
        f=$results/${link}_${v}_r$round.txt
        sps=$(field "$f" steps_per_s) loss=$(field "$f" loss) gsps=$(field "$g" steps_per_s) gloss=$(field "$g" loss)
        loss0=$(field "$f" loss0) gloss0=$(field "$g" loss0) x="-" rd="-" dd="-"
        [[ $sps != - && $gsps != - ]] && x=$(awk -v a="$sps" -v b="$gsps" 'BEGIN { printf "%.2f", a / b }')
        [[ $loss != - && $gloss != - ]] && rd=$(awk -v a="$loss" -v b="$gloss" 'BEGIN { printf "%+.2e", (a - b) / b }')
        [[ $loss != - && $gloss != - && $loss0 != - && $gloss0 != - ]] &&
          dd=$(awk -v a="$loss" -v b="$gloss" -v a0="$loss0" -v b0="$gloss0" 'BEGIN { d = b0 - b; if (d != 0) printf "%+.2e", ((a0 - a) - d) / d; else print "-" }')
        printf '%-5s %-12s %9s %11s %10s %7s %12s %12s %10s %10s %9s %10s %10s\n' "$round" "$v" "$sps" "$(field "$f" step_med_ms)" \
          "$(field "$f" compute_ms)" "$x" "$loss0" "$loss" "$rd" "$dd" \
          "$(upd_diff "$results/${link}_${v}_r$round.update.pt" "$results/${link}_gloo_r$round.update.pt")" "$(field "$f" wire_ratio)" \
          "$(cut -d' ' -f1 "$results/${link}_${v}_r$round.load" 2> /dev/null)"
      done
    done
  } | tee -a "$summary"
done
echo | tee -a "$summary"
echo "# targets: gs_int8 x_gloo >= 2.5 shaped, >= 1.0 unshaped; load average at end: $(load); raw outputs in $results" |
  tee -a "$summary"
