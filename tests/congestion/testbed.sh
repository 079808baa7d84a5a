# Congestion testbed: N "hosts" (network namespaces) on a switch (a bridge in its own
# namespace), each joined by a veth pair. Source it, then:
#   tb_setup N              hosts h0..h(N-1) at 198.19.1.1 .. 198.19.1.N
#   tb_shape I RATE         tbf on host I's uplink egress (RATE as tc writes it: 1gbit, 500mbit)
#   tb_unshape I            removes it
#   tb_exec I CMD...        runs CMD inside host I, with GS_HOSTNAME=tbhostI (see below)
#   tb_cleanup              deletes everything (also installed as an EXIT trap by tb_setup)
# Needs root and iproute2 (ip, tc with tbf). Uses 198.19.1.0/24 inside its own namespaces only;
# names carry the shell's pid, so concurrent runs do not collide, and tb_setup removes what a
# killed earlier run left behind.
#
# Each namespace is a host of its own: tb_exec gives what it runs the host name tbhost<I>
# (GS_HOSTNAME; a command may set its own after it, e.g. `tb_exec 0 env GS_HOSTNAME=a ...`).
# Otherwise ranks in different namespaces would share the machine's host name, and gradstream
# would connect them over shared memory (GS_SHM) instead of the shaped links.
#
# In a ring allreduce rank r sends data only to rank r+1, so host r's uplink egress is ring link
# r -> r+1: shaping it shapes that link and nothing else (credits going back are tiny).

TB_ID=${TB_ID:-$$}
TB_PREFIX="gsc${TB_ID}"
TB_SUBNET=198.19.1
TB_N=0

tb_ns() { echo "${TB_PREFIX}-h$1"; }
tb_dev() { echo "gc${TB_ID}h$1"; }
tb_addr() { echo "${TB_SUBNET}.$(($1 + 1))"; }

tb_remove_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^gsc[0-9]+-' || true); do
    pid=${ns#gsc}
    pid=${pid%%-*}
    if ! kill -0 "$pid" 2>/dev/null; then
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}

tb_cleanup() {
  local i
  for ((i = 0; i < TB_N; ++i)); do
    ip netns pids "$(tb_ns "$i")" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$(tb_ns "$i")" 2>/dev/null || true
  done
  ip netns del "${TB_PREFIX}-sw" 2>/dev/null || true
  TB_N=0
}

tb_setup() {
  local n=$1 i ns dev
  tb_remove_stale
  trap tb_cleanup EXIT
  ip netns add "${TB_PREFIX}-sw" || return 1
  TB_N=$n
  ip -n "${TB_PREFIX}-sw" link add br0 type bridge || return 1
  ip -n "${TB_PREFIX}-sw" link set br0 up || return 1
  for ((i = 0; i < n; ++i)); do
    ns=$(tb_ns "$i")
    dev=$(tb_dev "$i")
    ip netns add "$ns" || return 1
    ip link add "$dev" netns "$ns" type veth peer name "gc${TB_ID}s$i" netns "${TB_PREFIX}-sw" ||
      return 1
    ip -n "${TB_PREFIX}-sw" link set "gc${TB_ID}s$i" master br0 up || return 1
    ip -n "$ns" addr add "$(tb_addr "$i")/24" dev "$dev" || return 1
    ip -n "$ns" link set "$dev" up || return 1
    ip -n "$ns" link set lo up || return 1
  done
}

# tbf needs a bucket of at least one (GSO) packet, 64 KiB on veth, and a queue: `latency`
# bounds how long a packet may wait in it (TCP sees that queue as rtt).
tb_shape() {
  ip -n "$(tb_ns "$1")" link set "$(tb_dev "$1")" up
  tc -n "$(tb_ns "$1")" qdisc replace dev "$(tb_dev "$1")" root tbf rate "$2" burst 256kb \
    latency 20ms
}

tb_unshape() {
  tc -n "$(tb_ns "$1")" qdisc del dev "$(tb_dev "$1")" root 2>/dev/null || true
}

tb_exec() {
  local i=$1
  shift
  ip netns exec "$(tb_ns "$i")" env GS_HOSTNAME="tbhost$i" "$@"
}
