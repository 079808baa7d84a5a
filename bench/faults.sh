#!/usr/bin/env bash
# The fault table: what each rank of a 4-rank job is told, and how soon, when one rank (always
# rank 2) dies, stops, never joins, passes the wrong count or holds the wrong secret. Every rank
# is a gs-integ-rank process on 127.0.0.1, every process under `timeout`; each scenario runs
# TRIES times on a fresh port. Prints a Markdown table, then every try's per-rank outcome so the
# table can be checked. See bench/README.md.
#
#   bench/faults.sh [TRIES] [options]      TRIES: tries per scenario (default 5)
#     --out FILE        also write the tables to FILE
#     --timeout-ms MS   GS_TIMEOUT_MS of every rank (default 2000)
#     --margin-ms MS    a live rank must print its RESULT within the timeout plus this after the
#                       fault (default 3000); later counts as hung
#     --scenarios "..." which to run (default all): kill9_tcp kill9_shm sigstop_tcp sigstop_shm
#                       nojoin mismatch secret
#     --results DIR     keep every rank's stamped stdout and stderr there (default: a temporary
#                       directory, removed at exit)
#   GS_BUILD_DIR=dir    build tree holding tests/integration/gs-integ-rank (default <repo>/build)
set -euo pipefail
# EPOCHREALTIME's decimal point follows the locale; the arithmetic below needs a '.'.
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=${GS_BUILD_DIR:-$root/build}
bin=$build/tests/integration/gs-integ-rank

tries=5 out="" timeout_ms=2000 margin_ms=3000 results=""
all_scenarios="kill9_tcp kill9_shm sigstop_tcp sigstop_shm nojoin mismatch secret"
scenarios=$all_scenarios

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while (($#)); do
  case $1 in
    -h|--help) usage 0 ;;
    --out) out=${2:?}; shift ;;
    --timeout-ms) timeout_ms=${2:?}; shift ;;
    --margin-ms) margin_ms=${2:?}; shift ;;
    --scenarios) scenarios=${2:?}; shift ;;
    --results) results=${2:?}; shift ;;
    [0-9]*) tries=$1 ;;
    *) echo "faults.sh: unknown option $1" >&2; usage ;;
  esac
  shift
done
[[ $tries =~ ^[1-9][0-9]*$ ]] || { echo "faults.sh: TRIES must be a positive number" >&2; exit 2; }
for s in $scenarios; do
  [[ " $all_scenarios " == *" $s "* ]] || { echo "faults.sh: unknown scenario $s" >&2; exit 2; }
done
[[ -x $bin ]] || { echo "faults.sh: $bin not found (build first, or set GS_BUILD_DIR)" >&2; exit 1; }
command -v python3 > /dev/null || { echo "faults.sh: needs python3 (free-port check)" >&2; exit 1; }

readonly NRANKS=4 FAULTY=2
readonly COUNT=1048576 ODD_COUNT=1052675   # 4 MiB of float32; the mismatched rank's 4 MiB + 16 KiB
readonly SECRET=faults-secret
# Ranks started with WORLD_SIZE=4 wait for rank 2 up to the timeout; each script-side phase is
# bounded too, and `timeout` bounds each process beyond all of them, in case the script is slow.
startup_s=30
proc_limit_s=$((startup_s + 4 * timeout_ms / 1000 + margin_ms / 1000 + 10))

keep_results=1
if [[ -z $results ]]; then
  results=$(mktemp -d "${TMPDIR:-/tmp}/gs-faults.XXXXXX")
  keep_results=0
fi
mkdir -p "$results"

# Pids of this try's gs-integ-rank processes (from their pid files) and of the pipelines that
# carry their output; all are ended when a try ends and when the script exits for any reason.
pipes=()
kill_ranks() {
  local f pid
  for f in "$try_dir"/r*.pid; do
    [[ -s $f ]] || continue
    pid=$(< "$f")
    # Only our own rank binary: the pid may have been reused since it exited.
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | grep -q gs-integ-rank; then
      kill -KILL "$pid" 2> /dev/null || true
    fi
  done
}
try_dir=$results/none
cleanup() {
  kill_ranks
  local p
  for p in "${pipes[@]}"; do kill "$p" 2> /dev/null || true; done
  ((keep_results)) || rm -rf "$results"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_us() { local t=$EPOCHREALTIME; echo "${t/./}"; }

# A free tcp port on 127.0.0.1 in 20000-60000, never the same twice in one run: binding it
# (without SO_REUSEADDR, so a port in TIME_WAIT counts as taken) proves no one holds it now.
declare -A used_ports=()
free_port() {
  local p i
  for ((i = 0; i < 200; ++i)); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 40001))
    [[ -n ${used_ports[$p]:-} ]] && continue
    if python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$p" 2> /dev/null; then
      used_ports[$p]=1
      echo "$p"
      return 0
    fi
  done
  echo "faults.sh: no free port found" >&2
  return 1
}

# Prefixes every line with the wall-clock time in microseconds when the script read it. The
# script reads its injection time from the same clock ($EPOCHREALTIME; bash has no monotonic
# clock without a process per reading), and the spans measured are seconds long.
stamp() {
  local line t
  while IFS= read -r line; do
    t=$EPOCHREALTIME
    printf '%s %s\n' "${t/./}" "$line"
  done
}

# launch R COUNT ITERS SHM [SECRET]: starts rank R in the background. Its stdout goes through
# stamp() to r<R>.out, stderr to r<R>.err; r<R>.pid holds the binary's own pid (the shell that
# writes it execs the binary under timeout, so signals reach the rank, not timeout), r<R>.rc its
# exit status as timeout reports it (124: timeout's bound; 128+n: signal n) once it is gone.
launch() {
  local r=$1 count=$2 iters=$3 shm=$4 secret=${5:-$SECRET} d=$try_dir
  {
    # Nothing from the caller's environment that steers a rank may leak in (as the integration
    # tests do); GS_SOCKET_IFNAME unset keeps the rendezvous and tcp on loopback.
    env -u LOCAL_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID \
      -u SLURM_NTASKS -u PMI_RANK -u PMI_SIZE -u GS_TRANSPORT -u GS_CHUNK_BYTES \
      -u GS_SLOTS_PER_PEER -u GS_TCP_SOCKETS -u GS_CODEC -u GS_METRICS_ADDR -u GS_SOCKET_IFNAME \
      -u GS_HOSTNAME -u GS_ALGO \
      RANK="$r" WORLD_SIZE=$NRANKS MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" GS_SECRET="$secret" \
      GS_TIMEOUT_MS="$timeout_ms" GS_SHM="$shm" GS_DEBUG=warn \
      timeout -k 2 "$proc_limit_s" bash -c 'echo $$ > "$0"; exec "$@"' "$d/r$r.pid" \
      "$bin" loop "$count" "$iters" 2> "$d/r$r.err" && rc=0 || rc=$?
    echo "$rc" > "$d/r$r.rc"
  } 2> /dev/null | stamp > "$d/r$r.out" &   # (bash's own "Killed" notices: not the rank's)
  pipes+=($!)
}

iter_lines() {
  local n
  n=$(grep -c ' iter=' "$try_dir/r$1.out" 2> /dev/null) || true
  echo "${n:-0}"
}

# Waits until every started rank has printed READY or exited (bounded by the startup bound)
# and prints the latest READY stamp (now when none came).
last_ready() {
  local end=$(($(now_us) + startup_s * 1000000)) r s last=0 ok
  while :; do
    ok=1 last=0
    for r in "${started[@]}"; do
      s=$(grep -m1 '^[0-9]* READY ' "$try_dir/r$r.out" 2> /dev/null | cut -d' ' -f1) || true
      if [[ -n $s ]]; then ((s > last)) && last=$s
      elif [[ ! -e $try_dir/r$r.rc ]]; then ok=0; fi
    done
    ((ok)) && break
    (($(now_us) > end)) && break
    sleep 0.02
  done
  ((last > 0)) && echo "$last" || now_us
}

# Waits until every started rank has printed 3 iteration lines (all links up, data flowing).
# Returns 1 with a reason in $setup_error when one exits first or the startup bound passes.
wait_running() {
  local end=$(($(now_us) + startup_s * 1000000)) r ok
  while :; do
    ok=1
    for r in "${started[@]}"; do
      if [[ -e $try_dir/r$r.rc ]]; then
        setup_error="rank $r exited before the fault ($(result_field "$r" message))"
        return 1
      fi
      (($(iter_lines "$r") >= 3)) || ok=0
    done
    ((ok)) && return 0
    if (($(now_us) > end)); then
      setup_error="not every rank ran 3 allreduces within ${startup_s} s"
      return 1
    fi
    sleep 0.05
  done
}

# Polls until every started rank is gone or past its deadline (deadline[r], us); one past it
# is killed and marked hung. Hung or not is decided from the stamps, not from when this loop
# notices, so the poll interval does not matter.
wait_done() {
  local pending r
  while :; do
    pending=0
    for r in "${started[@]}"; do
      [[ -e $try_dir/r$r.rc || -n ${hung[$r]:-} ]] && continue
      if (($(now_us) > deadline[r])); then
        hung[$r]=1
        ((first_kill)) || first_kill=$(now_us)
        local pid
        pid=$(cat "$try_dir/r$r.pid" 2> /dev/null) || true
        if [[ -n $pid ]]; then
          kill -CONT "$pid" 2> /dev/null || true
          kill -KILL "$pid" 2> /dev/null || true
        fi
      else
        pending=1
      fi
    done
    ((pending)) || break
    sleep 0.05
  done
  kill_ranks
  local p
  for p in "${pipes[@]}"; do wait "$p" 2> /dev/null || true; done
  pipes=()
}

# last_line R INJ CONT: what rank R printed last and when, relative to INJ, and (CONT set) how
# many allreduces it finished while rank 2 was stopped and after SIGCONT: was a hung rank stuck,
# or did it wait out the stop and carry on?
last_line() {
  local line f=$try_dir/r$1.out
  line=$(tail -n 1 "$f" 2> /dev/null) || true
  [[ -n $line ]] || { echo "printed nothing"; return 0; }
  echo -n "last line at $(((${line%% *} - $2) / 1000)) ms: ${line#* }"
  if (($3)); then
    awk -v i="$2" -v c="$3" '/ iter=/ { if ($1 > i + 0 && $1 <= c + 0) d++; else if ($1 > c + 0) a++ }
      END { printf "; %d allreduces done while rank 2 was stopped, %d after SIGCONT", d, a }' "$f"
  fi
  echo
}
# result_line R: rank R's stamped RESULT line (empty when it printed none).
result_line() { grep -m1 '^[0-9]* RESULT ' "$try_dir/r$1.out" 2> /dev/null || true; }
# result_field R status|message|stamp
result_field() {
  local line
  line=$(result_line "$1")
  [[ -n $line ]] || return 0
  case $2 in
    stamp) echo "${line%% *}" ;;
    status) [[ $line =~ \ status=([^ ]*) ]] && echo "${BASH_REMATCH[1]}" || true ;;
    message) echo "${line#* message=}" ;;
  esac
}
# The rank a message blames: the first rank it names ("rank 2 failed (reported by rank 1; ...)",
# "connection to rank 2 failed", "rank(s) 2 never arrived"), after the phrases that name the
# reporting rank itself ("allreduce #7 on rank 0: ", "failed for rank 0 of 4").
blamed_rank() {
  local m
  m=$(sed -E 's/^[a-z_]+ #[0-9]+ on rank [0-9]+: //; s/ for rank [0-9]+ of [0-9]+//g' <<< "$1")
  [[ $m =~ rank(\(s\)|s)?\ ([0-9]+) ]] && echo "${BASH_REMATCH[2]}" || true
}

readonly RS=$'\x1e'   # field separator of raw_rows: messages may hold any printable character
raw_rows=()    # scenario, try, rank, role, status, ms, message per rank per try
declare -A sc_tries sc_survived sc_blame sc_ms sc_rep sc_rep_ok sc_note

# run_try SCENARIO TRY
run_try() {
  local sc=$1 t=$2 shm=0 r
  try_dir=$results/$sc.try$t
  mkdir -p "$try_dir"
  port=$(free_port)
  started=() hung=() setup_error="" first_kill=0
  declare -gA role=()
  local -a deadline=()
  local inj cont=0 victim_pid
  [[ $sc == *_shm ]] && shm=1

  case $sc in
    kill9_* | sigstop_*)
      for ((r = 0; r < NRANKS; ++r)); do launch "$r" $COUNT 0 "$shm"; started+=("$r"); role[$r]=live; done
      if wait_running; then
        victim_pid=$(< "$try_dir/r$FAULTY.pid")
        if [[ $sc == kill9_* ]]; then
          role[$FAULTY]=killed
          inj=$(now_us)
          kill -KILL "$victim_pid"
        else
          role[$FAULTY]=stopped
          inj=$(now_us)
          kill -STOP "$victim_pid"
          # Held for twice the timeout: the others must give up on it by themselves meanwhile.
          # (A background sleep: a signal to the script runs its trap now, not after the hold.)
          sleep "$(awk -v ms="$timeout_ms" 'BEGIN { printf "%.3f", 2 * ms / 1000 }')" &
          pipes+=($!)
          wait $!
          cont=$(now_us)
          kill -CONT "$victim_pid"
        fi
      else
        inj=$(now_us)
      fi
      ;;
    nojoin)
      role[$FAULTY]=absent
      inj=$(now_us)   # the rendezvous clock starts with the ranks
      for ((r = 0; r < NRANKS; ++r)); do
        ((r == FAULTY)) && continue
        launch "$r" $COUNT 3 0; started+=("$r"); role[$r]=live
      done
      ;;
    mismatch)
      for ((r = 0; r < NRANKS; ++r)); do
        launch "$r" $((r == FAULTY ? ODD_COUNT : COUNT)) 3 0; started+=("$r"); role[$r]=live
      done
      role[$FAULTY]=odd_count
      # The mismatched collective starts once every communicator is up: time it from the last
      # READY (the counts only meet in the first allreduce).
      inj=$(last_ready)
      ;;
    secret)
      inj=$(now_us)
      for ((r = 0; r < NRANKS; ++r)); do
        if ((r == FAULTY)); then launch "$r" $COUNT 3 0 not-the-secret; else launch "$r" $COUNT 3 0; fi
        started+=("$r"); role[$r]=live
      done
      role[$FAULTY]=impostor
      ;;
  esac

  # Kept with the outputs (--results): the stamps the times are measured from.
  printf 'port %s\ninject %s\ncont %s\n' "$port" "$inj" "$cont" > "$try_dir/events"
  local span=$(((timeout_ms + margin_ms) * 1000))
  for r in "${started[@]}"; do
    deadline[r]=$((inj + span))
    [[ ${role[$r]} == stopped ]] && deadline[r]=$((cont + span))
    [[ ${role[$r]} == killed ]] && deadline[r]=$((inj + 5000000))
  done
  wait_done

  # Per-rank outcome. A live rank survives when it printed a GS_ERR_* RESULT by its deadline
  # and exited; the stopped rank must too, after SIGCONT.
  local ok=1 blame_ok=1 st ms msg stamp_ rc expected tr
  expected=$([[ $shm == 1 ]] && echo shm || echo tcp)
  local -a rows=()
  for ((r = 0; r < NRANKS; ++r)); do
    case ${role[$r]:-} in
      killed) raw_rows+=("$sc$RS$t$RS$r${RS}killed${RS}SIGKILL$RS-$RS")
              rows+=("r$r: killed"); continue ;;
      absent) raw_rows+=("$sc$RS$t$RS$r${RS}absent$RS-$RS-$RS")
              rows+=("r$r: never started"); continue ;;
    esac
    st=$(result_field "$r" status)
    msg=$(result_field "$r" message)
    stamp_=$(result_field "$r" stamp)
    rc=$(cat "$try_dir/r$r.rc" 2> /dev/null || echo none)
    ms=-
    [[ -n $stamp_ ]] && ms=$(((stamp_ - inj) / 1000))
    if [[ -n $setup_error ]]; then
      st=SETUP_FAILED msg="$setup_error; ${msg:-no RESULT}"
    elif [[ -z $st ]]; then
      if [[ -n ${hung[$r]:-} ]]; then
        st=HUNG msg="no RESULT within $(((deadline[r] - inj) / 1000)) ms; $(last_line "$r" "$inj" "$cont")"
      else st=NO_RESULT msg="exited ($rc) without a RESULT line"; fi
    elif (( stamp_ > deadline[r] )); then
      st="$st(late)"
    elif [[ -n ${hung[$r]:-} ]]; then
      st="$st(no_exit)"
    fi
    [[ $st == GS_ERR_* && $st != *'('* ]] || ok=0
    # The cause: every rank told of the mismatch; elsewhere every rank but 2 blaming rank 2.
    if [[ $sc == mismatch ]]; then
      [[ $msg == *"count differs"* ]] || blame_ok=0
    elif ((r != FAULTY)); then
      [[ $(blamed_rank "$msg") == "$FAULTY" ]] || blame_ok=0
    fi
    # Times: live ranks only; the stopped rank's is from SIGCONT and goes into its message.
    if [[ ${role[$r]} == stopped ]]; then
      [[ -n $stamp_ ]] && ms=$(((stamp_ - cont) / 1000))
      # Its connections may have closed because the script ended the others as hung.
      ((${#hung[@]})) && [[ -n $stamp_ ]] && ((stamp_ > first_kill)) &&
        msg+=" [after the script had killed the hung ranks]"
      raw_rows+=("$sc$RS$t$RS$r${RS}stopped (ms from SIGCONT)$RS$st$RS$ms$RS$msg")
      rows+=("r$r (stopped; +${ms} ms after SIGCONT): $st: $(shorten "$msg")")
    else
      raw_rows+=("$sc$RS$t$RS$r$RS${role[$r]}$RS$st$RS$ms$RS$msg")
      rows+=("r$r: $st: $(shorten "$msg")")
      [[ $st == GS_ERR_* && $ms != - ]] && sc_ms[$sc]+="$ms "
    fi
    # A run that did not use the transport it is named after measures something else.
    tr=$(grep -m1 -o ' READY .*transport=[a-z+]*' "$try_dir/r$r.out" | sed 's/.*transport=//' || true)
    if [[ $sc == kill9_* || $sc == sigstop_* ]] && [[ -n $tr && $tr != "$expected" ]]; then
      sc_note[$sc]="rank $r ran over $tr, not $expected"
    fi
  done
  [[ -n $setup_error ]] && blame_ok=0
  sc_tries[$sc]=$((${sc_tries[$sc]:-0} + 1))
  sc_survived[$sc]=$((${sc_survived[$sc]:-0} + ok))
  sc_blame[$sc]=$((${sc_blame[$sc]:-0} + blame_ok))
  # The representative try: the first that survived, else the first.
  if [[ -z ${sc_rep[$sc]:-} ]] || { ((ok)) && [[ -z ${sc_rep_ok[$sc]:-} ]]; }; then
    local IFS=$'\x1f'
    sc_rep[$sc]="try $t: ${rows[*]}"
    ((ok)) && sc_rep_ok[$sc]=1
  fi
  printf 'faults.sh: %s try %d: %s (port %d)\n' "$sc" "$t" \
    "$( ((ok)) && echo survived || echo 'NOT survived')" "$port" >&2
}

# For the summary table: the cause and every rank number stay; what goes is the reporting rank's
# own "allreduce #7 on rank 0: " (the row names it), ports and pids, the chunk's position; what
# is still long loses its middle (the front says who and what, the end who passed it on).
shorten() {
  local m max=240
  m=$(sed -E 's/^[a-z_]+ #[0-9]+ on rank [0-9]+: //
    s/rendezvous with 127\.0\.0\.1:[0-9]+ failed for rank [0-9]+ of [0-9]+: /rendezvous: /
    s/ \(127\.0\.0\.1:[0-9]+\)//g; s/, server 127\.0\.0\.1:[0-9]+//g; s/ \(pid [0-9]+\)//g
    s/ \(step [0-9]+, chunk [0-9]+\)//g; s/ \(waiting for chunk [0-9]+ of step [0-9]+ from rank [0-9]+\)//g
    s/received count ([0-9]+) elements [0-9]+, expected count ([0-9]+) elements [0-9]+/received \1, expected \2/' <<< "$1")
  ((${#m} <= max)) && { echo "$m"; return 0; }
  echo "${m:0:130} ... ${m: -65}"
}
md() { local s=${1//|/\\|}; echo "${s//$'\x1f'/<br>}"; }   # a Markdown cell

# stats "ms ms ...": "median / max"
stats() {
  [[ -n ${1// /} ]] || { echo "-"; return; }
  tr ' ' '\n' <<< "$1" | grep . | sort -n | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%d / %d\n", m, v[NR] }'
}

describe() {
  case $1 in
    kill9_tcp) echo "kill -9 rank 2 mid-loop, tcp (GS_SHM=0)" ;;
    kill9_shm) echo "kill -9 rank 2 mid-loop, shm (GS_SHM=1)" ;;
    sigstop_tcp) echo "SIGSTOP rank 2 mid-loop for 2x timeout, then SIGCONT, tcp" ;;
    sigstop_shm) echo "SIGSTOP rank 2 mid-loop for 2x timeout, then SIGCONT, shm" ;;
    nojoin) echo "rank 2 never started (3 of 4 ranks)" ;;
    mismatch) echo "rank 2 count $ODD_COUNT, others $COUNT (tcp)" ;;
    secret) echo "rank 2 with another GS_SECRET" ;;
  esac
}

t0=$(now_us)
echo "faults.sh: $tries tries per scenario, GS_TIMEOUT_MS=$timeout_ms, deadline timeout + ${margin_ms} ms, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for sc in $scenarios; do
  for ((t = 1; t <= tries; ++t)); do run_try "$sc" "$t"; done
done
t1=$(now_us)

report() {
  echo "## Fault table"
  echo
  echo "4 ranks as processes on 127.0.0.1 (gs-integ-rank, float32 sum allreduce of $COUNT elements in a loop), \`GS_TIMEOUT_MS=$timeout_ms\`, $tries tries per scenario, $(date '+%Y-%m-%d %H:%M'), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(((t1 - t0) / 1000000)) s in all."
  echo "survived: tries where every live rank printed a \`GS_ERR_*\` RESULT within timeout + $margin_ms ms of the fault and exited (none hung). ms: fault to RESULT line, over the live ranks of every try (the stopped rank's own time, from SIGCONT, is in its message). names cause: tries where every other rank's message blames rank 2 (the first rank it names besides itself), in the mismatch every rank's message says \`count differs\`."
  echo
  echo "| scenario | tries | survived | names cause | median / max ms | messages (one try) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  local sc d
  for sc in $scenarios; do
    d=$(describe "$sc")
    [[ -n ${sc_note[$sc]:-} ]] && d+=" (${sc_note[$sc]}!)"
    echo "| $(md "$d") | ${sc_tries[$sc]} | ${sc_survived[$sc]} | ${sc_blame[$sc]} | $(stats "${sc_ms[$sc]:-}") | $(md "${sc_rep[$sc]}") |"
  done
  echo
  echo "### Per try, per rank"
  echo
  echo "| scenario | try | rank | role | status | ms | message |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  local row
  for row in "${raw_rows[@]}"; do
    IFS=$RS read -r a b c e f g h <<< "$row"
    echo "| $a | $b | $c | $e | $f | $g | $(md "$h") |"
  done
}
report_text=$(report)
echo "$report_text"
[[ -z $out ]] || echo "$report_text" > "$out"
((keep_results)) && echo "faults.sh: raw outputs in $results" >&2
exit 0
