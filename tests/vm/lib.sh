# shellcheck shell=bash
# Helpers for commands running inside the test VM (source it from bash). Every wait has a
# deadline, and none execs a process per poll (each exec costs milliseconds under TCG).

# vm_sleep SECONDS: sleeps without starting a process (reads a private FIFO with a timeout).
vm_sleep() {
  if [[ -z ${_vm_fifo_fd:-} ]]; then
    # /dev/shm is a tmpfs in the guest (9p shares cannot hold FIFOs).
    local fifo=/dev/shm/vm-sleep.$$.$RANDOM
    if mkfifo -m 600 "$fifo" 2>/dev/null; then
      exec {_vm_fifo_fd}<>"$fifo"
      rm -f "$fifo"
    else
      _vm_fifo_fd=none
    fi
  fi
  if [[ $_vm_fifo_fd == none ]]; then
    sleep "$1"
  else
    read -r -t "$1" -u "$_vm_fifo_fd" _ || true
  fi
}

# vm_wait_listen PORT [SECONDS]: waits until some TCP socket listens on PORT (IPv4 or IPv6);
# returns 1 after SECONDS (default 30).
vm_wait_listen() {
  local port hex deadline f local_addr st _
  port=$1
  deadline=$((SECONDS + ${2:-30}))
  printf -v hex ':%04X' "$port"
  while ((SECONDS < deadline)); do
    for f in /proc/net/tcp /proc/net/tcp6; do
      [[ -r $f ]] || continue
      while read -r _ local_addr _ st _; do
        if [[ $local_addr == *"$hex" && $st == 0A ]]; then return 0; fi
      done <"$f"
    done
    vm_sleep 0.1
  done
  echo "vm_wait_listen: nothing listens on port $port after ${2:-30} s" >&2
  return 1
}
