#!/bin/sh
# Builds the release tarball: dist/cairn-<version>-linux-<arch>.tar.gz holding
#
#   bin/cairn                       the binary (cargo build --release, or --binary PATH)
#   packaging/install.sh            the installer, which installs bin/cairn when run from here
#   packaging/cairn-killall.sh, packaging/cairn-uninstall.sh
#   systemd/cairn.service, systemd/cairn-agent.service
#   images/                         with --images DIR: air-gap image tarballs (OCI layout or
#                                   `docker save`, plain, .gz or .zst), which the installer puts in
#                                   <data-dir>/agent/images/ for cairn to import at start
#   README.md, ARCHITECTURE.md
#
# Options: --binary PATH (package this build), --images DIR, --out DIR (default: dist), --help.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
binary=""
images=""
out="$here/dist"
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=${2:?--binary needs a path}; shift ;;
        --images) images=${2:?--images needs a directory}; shift ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        -h | --help) sed -n '2,16s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "release.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
say() { printf 'release.sh: %s\n' "$*"; }

if [ -z "$binary" ]; then
    say "building cairn (cargo build --release --locked)"
    (cd "$here" && cargo build --release --locked)
    binary="$here/target/release/cairn"
fi
[ -x "$binary" ] || { echo "release.sh: $binary is not an executable file" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -n 1)
case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    armv7l) arch=arm ;;
    *) arch=$(uname -m) ;;
esac
name="cairn-$version-linux-$arch"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dir="$stage/$name"
mkdir -p "$dir/bin" "$dir/packaging" "$dir/systemd"
install -m 0755 "$binary" "$dir/bin/cairn"
install -m 0755 "$here/packaging/install.sh" "$here/packaging/cairn-killall.sh" "$here/packaging/cairn-uninstall.sh" "$dir/packaging/"
install -m 0644 "$here/systemd/cairn.service" "$here/systemd/cairn-agent.service" "$dir/systemd/"
install -m 0644 "$here/README.md" "$here/ARCHITECTURE.md" "$dir/"
if [ -n "$images" ]; then
    mkdir -p "$dir/images"
    found=0
    for image in "$images"/*.tar "$images"/*.tar.gz "$images"/*.tar.zst; do
        [ -e "$image" ] || continue
        install -m 0644 "$image" "$dir/images/"
        found=$((found + 1))
    done
    [ "$found" -gt 0 ] || { echo "release.sh: --images $images holds no .tar, .tar.gz or .tar.zst" >&2; exit 1; }
    say "bundled $found air-gap image tarball(s)"
fi
mkdir -p "$out"
tar -C "$stage" -czf "$out/$name.tar.gz" "$name"
say "wrote $out/$name.tar.gz ($(du -h "$out/$name.tar.gz" | cut -f1))"
