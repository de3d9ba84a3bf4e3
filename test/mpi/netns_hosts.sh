#!/usr/bin/env bash
# netns_hosts.sh — N private "hosts" on this machine for multi-host tests (sourced; test/README.md,
# Multi-host tests).
#
#   . test/mpi/netns_hosts.sh
#   netns_hosts_start DIR N || { skip "...: $NETNS_HOSTS_WHY"; exit 0; }
#   "${NETNS_MPIRUN[@]}" -np 4 build/cooktrain train ...    # mpirun on host 0, ranks on all hosts
#   netns_hosts_stop
#
# Each host is a network namespace with its own hostname (a UTS namespace, entered per command)
# and one interface, eth0, addressed 198.18.0.(i+1)/24 (198.18.0.0/15 is reserved for network
# benchmarks, RFC 2544); the hosts' eth0s are veth pairs whose other ends are ports of one bridge
# inside a namespace of its own. Nothing routes out: no namespace has a default route, and the
# bridge's namespace has no other link. The namespaces are named ct<pid>-h<i> and ct<pid>-br, so
# concurrent test runs never share one.
#
# NETNS_MPIRUN is mpirun started inside host 0 with a hostfile naming every host's address with
# NETNS_SLOTS slots (2 unless set), so --map-by slot (Open MPI's default) fills host 0 first:
# world ranks 0..slots-1 on host 0, and so on. Open MPI launches its daemon on every other host
# through test/mpi/netns_agent.sh (plm_rsh_agent: the launch ssh would do, into the host's namespace),
# and its MPI traffic travels over TCP on the hosts' addresses only: the shared-memory transport
# (vader) is excluded, so ranks on different hosts can reach each other only across the veth
# links. Every mpirun is bounded by `timeout` (NETNS_TIMEOUT seconds, 300 unless set).
# netns_link_bytes I prints the bytes host I's link has carried (received + sent, read at the
# bridge's port), so a test can check that traffic crossed it; netns_host_pids I lists the
# processes inside host I; netns_hosts_stop kills them all and deletes every namespace it made.
#
# When it cannot run (not root, `ip` or `unshare` missing, or the kernel refuses a namespace, as
# in an unprivileged container) start returns 1 with the reason in NETNS_HOSTS_WHY.

NETNS_HOSTS_NS=()
NETNS_HOSTS_BRIDGE=

netns_hosts_start() {
    local dir=$1 n=$2 i ns why
    NETNS_HOSTS_WHY=
    if [ "$(id -u)" != 0 ]; then
        NETNS_HOSTS_WHY="not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        return 1
    fi
    for cmd in ip unshare mpirun; do
        if ! command -v "$cmd" >/dev/null 2>&1; then
            NETNS_HOSTS_WHY="$cmd not found"
            return 1
        fi
    done
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    NETNS_HOSTS_BRIDGE=ct$$-br
    if ! why=$(ip netns add "$NETNS_HOSTS_BRIDGE" 2>&1); then
        NETNS_HOSTS_WHY="the kernel refuses a network namespace: $why"
        NETNS_HOSTS_BRIDGE=
        return 1
    fi
    ip -n "$NETNS_HOSTS_BRIDGE" link add br0 type bridge &&
        ip -n "$NETNS_HOSTS_BRIDGE" link set br0 up || {
        NETNS_HOSTS_WHY="cannot make a bridge (no bridge support in the kernel?)"
        netns_hosts_stop
        return 1
    }
    : >"$dir/hostfile"
    : >"$dir/map"
    for ((i = 0; i < n; i++)); do
        ns=ct$$-h$i
        ip netns add "$ns" &&
            NETNS_HOSTS_NS+=("$ns") &&
            ip link add "p$i" netns "$NETNS_HOSTS_BRIDGE" type veth peer name eth0 netns "$ns" &&
            ip -n "$NETNS_HOSTS_BRIDGE" link set "p$i" master br0 up &&
            ip -n "$ns" addr add "198.18.0.$((i + 1))/24" dev eth0 &&
            ip -n "$ns" link set eth0 up &&
            ip -n "$ns" link set lo up || {
            NETNS_HOSTS_WHY="cannot wire host $i (veth pair, address or link)"
            netns_hosts_stop
            return 1
        }
        echo "198.18.0.$((i + 1)) slots=${NETNS_SLOTS:-2}" >>"$dir/hostfile"
        echo "198.18.0.$((i + 1)) $ns" >>"$dir/map"
    done
    export NETNS_HOSTS_MAP=$dir/map
    local agent
    agent=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/netns_agent.sh
    NETNS_MPIRUN=(timeout "${NETNS_TIMEOUT:-300}" ip netns exec "${NETNS_HOSTS_NS[0]}"
        unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "${NETNS_HOSTS_NS[0]}"
        mpirun --hostfile "$dir/hostfile" --oversubscribe --bind-to none
        --mca plm_rsh_agent "$agent" --mca btl tcp,self
        --mca btl_tcp_if_include 198.18.0.0/24 --mca oob_tcp_if_include 198.18.0.0/24)
    return 0
}

netns_link_bytes() {
    ip -n "$NETNS_HOSTS_BRIDGE" -s link show "p$1" |
        awk '/RX:/ { getline; rx = $1 } /TX:/ { getline; tx = $1 } END { print rx + tx }'
}

netns_host_pids() {
    ip netns pids "${NETNS_HOSTS_NS[$1]}"
}

netns_hosts_stop() {
    local ns pids
    for ns in "${NETNS_HOSTS_NS[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        # shellcheck disable=SC2086
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    done
    for ns in "${NETNS_HOSTS_NS[@]}" $NETNS_HOSTS_BRIDGE; do
        ip netns del "$ns" 2>/dev/null
    done
    NETNS_HOSTS_NS=()
    NETNS_HOSTS_BRIDGE=
}
