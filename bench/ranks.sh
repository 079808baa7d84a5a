# Sourced by the benchmark scripts that start ranks as background processes themselves.
#
# wait_ranks PID...: waits for every rank; when one fails the others are ended (by their pids)
# at once instead of each waiting for its own timeout. Returns the first failure's status.
wait_ranks() {
  local pids=("$@") rc=0 fin st r pid
  while ((${#pids[@]})); do
    wait -n -p fin "${pids[@]}"
    st=$?
    for r in "${!pids[@]}"; do [[ ${pids[r]} == "$fin" ]] && unset 'pids[r]'; done
    if ((st != 0 && rc == 0)); then
      rc=$st
      for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null; done
    fi
  done
  return $rc
}
