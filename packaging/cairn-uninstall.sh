#!/bin/sh
# Removes cairn from this machine (k3s's k3s-uninstall.sh; installed as cairn-uninstall.sh for a
# server and cairn-agent-uninstall.sh for a joined node): stops everything with cairn-killall.sh,
# then removes the service, its environment file, the binary, these scripts, /etc/cairn, the data
# directory and kubelet's directory. Run as root.
#
# CAIRN_ROOT (default: the root this was installed into) prefixes every path; CAIRN_DATA_DIR is the
# data directory (default /var/lib/cairn).
set -u

root=${CAIRN_ROOT:-@ROOT@}
# Not installed (run from the source tree): the machine's own root. The marker is split so that
# the installer's substitution leaves this test alone.
[ "$root" = "@""ROOT@" ] && root=
data=${CAIRN_DATA_DIR:-/var/lib/cairn}
bin="$root/usr/local/bin"
say() { printf 'cairn-uninstall: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "cairn-uninstall: run as root" >&2
    exit 1
fi

CAIRN_ROOT="$root" CAIRN_DATA_DIR="$data" sh "$bin/cairn-killall.sh"

for unit in cairn cairn-agent; do
    file="$root/etc/systemd/system/$unit.service"
    [ -e "$file" ] || continue
    if [ -z "$root" ] && command -v systemctl >/dev/null 2>&1; then
        systemctl disable "$unit" >/dev/null 2>&1
    fi
    rm -f "$file" && say "removed the service $unit"
done
[ -z "$root" ] && command -v systemctl >/dev/null 2>&1 && systemctl daemon-reload >/dev/null 2>&1

rm -f "$root/etc/default/cairn" "$bin/cairn"
rm -rf "$root/etc/cairn" "$root$data" "$root/var/lib/kubelet" "$root/run/cairn"
say "removed the binary, /etc/cairn, $data and /var/lib/kubelet"
rm -f "$bin/cairn-killall.sh" "$bin/cairn-uninstall.sh" "$bin/cairn-agent-uninstall.sh"
exit 0
