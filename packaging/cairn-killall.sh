#!/bin/sh
# Stops cairn, every pod it runs and its network on this machine, leaving its data alone (k3s's
# k3s-killall.sh). Run as root. After it, `systemctl start cairn` (or cairn-agent) brings the node
# back with its pods.
#
# What goes: the cairn and cairn-agent services, cairn's containerd and every container shim it
# started, the mounts under cairn's and kubelet's directories, the pod bridge cni0 and the pods'
# veths, the VXLAN device cairn.1, the pods' network namespaces, the iptables chains CAIRN-*, the
# nftables table `ip cairn-proxy`, the routes to other nodes' pods (protocol 202) and the cluster DNS address on lo.
#
# CAIRN_ROOT (default: the root this was installed into) prefixes every file path, for installs
# into a directory tree; CAIRN_DATA_DIR is the data directory (default /var/lib/cairn);
# CAIRN_CLUSTER_DNS the cluster DNS address (default 10.43.0.10).
set -u

root=${CAIRN_ROOT:-@ROOT@}
# Not installed (run from the source tree): the machine's own root. The marker is split so that
# the installer's substitution leaves this test alone.
[ "$root" = "@""ROOT@" ] && root=
data=${CAIRN_DATA_DIR:-/var/lib/cairn}
cluster_dns=${CAIRN_CLUSTER_DNS:-10.43.0.10}
say() { printf 'cairn-killall: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "cairn-killall: run as root" >&2
    exit 1
fi

# The services first, so nothing restarts what follows (only on the machine's own root).
if [ -z "$root" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    for unit in cairn cairn-agent; do
        systemctl stop "$unit" >/dev/null 2>&1 && say "stopped $unit"
    done
fi

# cairn's own processes and containerd, then the shims (each one's containers go with it).
for pattern in "$root/usr/local/bin/cairn server" "$root/usr/local/bin/cairn agent" \
    "containerd --config $root$data/agent/containerd/config.toml"; do
    pkill -TERM -f "^$pattern" 2>/dev/null && say "stopped $pattern"
done
for pid in $(pgrep -f "containerd-shim.* -address ($root$data|$root/run/cairn)/" 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null
done

# Mounts under cairn's and kubelet's directories, deepest first.
for dir in "$root/run/cairn" "$root$data" "$root/var/lib/kubelet/pods" "$root/var/lib/kubelet/plugins"; do
    awk -v d="$dir/" 'index($2 "/", d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null
    done
done

# The pods' network namespaces (containerd names them cni-<uuid>), on the machine's own root only:
# an install into a directory tree shares none of them.
if [ -z "$root" ]; then
    for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ { print $1 }'); do
        ip netns delete "$ns" 2>/dev/null
    done
fi

# The pod bridge and whatever is still attached to it, the routes to other nodes' pods, the
# cluster DNS address.
for link in $(ip -o link show master cni0 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
    ip link delete "$link" 2>/dev/null
done
ip link delete cni0 2>/dev/null && say "removed the pod bridge cni0"
ip link delete cairn.1 2>/dev/null && say "removed the VXLAN device cairn.1"
ip route flush proto 202 2>/dev/null
ip addr delete "$cluster_dns/32" dev lo 2>/dev/null

# Netfilter: cairn's iptables chains in every table, and the service proxy's nftables table.
for save in iptables-save ip6tables-save; do
    restore=$(echo "$save" | sed 's/-save/-restore/')
    command -v "$save" >/dev/null 2>&1 || continue
    if "$save" 2>/dev/null | grep -q CAIRN-; then
        "$save" | grep -v -- '-j CAIRN-\|^:CAIRN-\|-A CAIRN-' | "$restore" && say "removed the iptables chains CAIRN-* ($save)"
    fi
done
if command -v nft >/dev/null 2>&1 && nft list table ip cairn-proxy >/dev/null 2>&1; then
    nft delete table ip cairn-proxy && say "removed the nftables table ip cairn-proxy"
fi
exit 0
