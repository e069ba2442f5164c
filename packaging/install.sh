#!/bin/sh
# Installs a built cairn binary as a systemd service, the way k3s's installer does.
#   sudo packaging/install.sh [path/to/cairn]
set -eu
bin=${1:-target/release/cairn}
here=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
[ -x "$bin" ] || { echo "install.sh: $bin not found; build it with: cargo build --release" >&2; exit 1; }
install -m 0755 "$bin" /usr/local/bin/cairn
install -m 0644 "$here/systemd/cairn.service" /etc/systemd/system/cairn.service
mkdir -p /etc/cairn
systemctl daemon-reload
systemctl enable --now cairn
echo "cairn installed; kubeconfig: /etc/cairn/cairn.yaml (export KUBECONFIG=/etc/cairn/cairn.yaml)"
