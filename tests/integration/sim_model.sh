#!/usr/bin/env bash
# gradstream-sim against the closed forms it must reproduce: no timing, only arithmetic, so it
# cannot flake (the comparison with measured runs is a benchmark: bench/sim_vs_measured.sh).
# One host, every link alpha = 10 us and 1 Gbit/s (beta = 8 ns/B), reduction free, 1 MiB chunks:
#   ring, N ranks, S bytes:   2 (N-1) (alpha + r S/N beta)   (r: codec ratio; messages of S/N)
#   halving-doubling busbw:   the link's 0.125 GB/s within 1 % (it moves 2 (N-1)/N S per rank)
#   tree:                     slower than the ring at 4 MiB (a whole message per level)
#   recursive doubling:       log2(N) (alpha + S beta)   (whole buffers, one round after another)
set -euo pipefail
sim=${GS_SIM:?set GS_SIM to gradstream-sim}
fail=0
alpha_us=10 gbps=1
row() {  # row N ratio algo -> "time_us busbw"
  "$sim" --ranks "$1" --per-host 16 --intra-us $alpha_us --intra-gbps $gbps --reduce-gbps 1000000 \
    --chunk 1048576 --codec-ratio "$2" -b 4M -e 4M |
    awk -v a="$3" '!/^#/ && $2 == a { print $3, $5; found = 1 } END { exit !found }'
}
check() {  # check what got want tolerance
  local verdict
  verdict=$(awk -v g="$2" -v w="$3" -v t="$4" 'BEGIN { d = g / w - 1; if (d < 0) d = -d; print (d <= t) ? "ok" : "FAIL" }')
  printf '%-44s got %12.4f  expected %12.4f  (within %s) %s\n' "$1" "$2" "$3" "$4" "$verdict"
  [[ $verdict == ok ]] || fail=1
}
bytes=4194304
for n in 2 4 8; do
  for ratio in 1 0.5; do
    read -r us _ < <(row $n $ratio ring)
    want=$(awk -v n=$n -v r=$ratio -v s=$bytes -v a=$alpha_us -v g=$gbps \
      'BEGIN { print 2 * (n - 1) * (a + r * s / n * 8 / (g * 1000)) }')
    check "ring N=$n ratio $ratio: time (us)" "$us" "$want" 0.001
  done
  read -r _ busbw < <(row $n 1 halving_doubling)
  check "halving_doubling N=$n: busbw (GB/s)" "$busbw" 0.125 0.01
  read -r us _ < <(row $n 1 recursive_doubling)
  want=$(awk -v n=$n -v s=$bytes -v a=$alpha_us -v g=$gbps \
    'BEGIN { print log(n) / log(2) * (a + s * 8 / (g * 1000)) }')
  check "recursive_doubling N=$n: time (us)" "$us" "$want" 0.001
  read -r tree_us _ < <(row $n 1 tree)
  read -r ring_us _ < <(row $n 1 ring)
  if awk -v t="$tree_us" -v r="$ring_us" 'BEGIN { exit !(t > r) }'; then
    echo "tree N=$n: $tree_us us > ring $ring_us us ok"
  else
    echo "tree N=$n: $tree_us us not slower than ring $ring_us us FAIL"; fail=1
  fi
done
# --cores: 3 ranks on one host of 2 cores over tcp, 16 MiB. With a core per rank the ring is
# the fastest; crowded, the closed form (cost_model.h) puts it behind halving-doubling, whose
# fold leaves two ranks working (as measured: bench/algo_choice.sh).
crowded() {  # crowded CORES algo -> "time_us how"
  "$sim" --ranks 3 --per-host 3 --transport tcp ${1:+--cores "$1"} -b 16M -e 16M |
    awk -v a="$2" '!/^#/ && $2 == a { print $3, $NF; found = 1 } END { exit !found }'
}
read -r ring_free _ < <(crowded "" ring)
read -r hd_free _ < <(crowded "" halving_doubling)
read -r ring_two how < <(crowded 2 ring)
read -r hd_two _ < <(crowded 2 halving_doubling)
if awk -v r="$ring_free" -v h="$hd_free" -v r2="$ring_two" -v h2="$hd_two" \
  'BEGIN { exit !(r < h && r2 > h2) }' && [[ $how == form ]]; then
  echo "3 ranks, tcp, 16 MiB: ring $ring_free < hd $hd_free us; on 2 cores ring $ring_two > hd $hd_two us (closed form) ok"
else
  echo "3 ranks, tcp, 16 MiB: ring $ring_free / hd $hd_free us; on 2 cores ring $ring_two / hd $hd_two us ($how) FAIL"
  fail=1
fi
exit $fail
