#!/bin/sh
# netns_agent.sh — Open MPI's remote launch agent for the namespace "hosts" of test/mpi/netns_hosts.sh
# (plm_rsh_agent: called as ssh would be, `netns_agent.sh HOST COMMAND...`). It runs COMMAND
# (Open MPI's orted) inside HOST's network namespace, under that host's own hostname (a UTS
# namespace of its own), by looking HOST's address up in the map file $NETNS_HOSTS_MAP
# ("ADDRESS NAMESPACE" lines). As with ssh, the command is one shell line.
host=$1
shift
ns=$(awk -v h="$host" '$1 == h { print $2 }' "$NETNS_HOSTS_MAP")
if [ -z "$ns" ]; then
    echo "netns_agent.sh: no namespace host $host in $NETNS_HOSTS_MAP" >&2
    exit 1
fi
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$ns" "$*"
