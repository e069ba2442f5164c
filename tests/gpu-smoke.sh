#!/usr/bin/env bash
# GPU smoke test, for a machine with a real NVIDIA GPU and driver (not part of the suite, which fakes
# the driver tree). Starts cairn with GPU discovery on, shows what it found, and runs a pod asking for
# one nvidia.com/gpu whose container lists its GPU: `nvidia-smi -L` where the image can run it (the
# driver's tool is mounted at /usr/local/nvidia/bin), else its NVIDIA device nodes.
#
#   sudo tests/gpu-smoke.sh [path/to/cairn]     (default: target/release/cairn, else target/debug/cairn)
#   IMAGE=nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04 sudo -E tests/gpu-smoke.sh   (a pullable image)
#
# Needs root, containerd, runc and kubectl (PATH or .venv/bin); the default image is built here from
# Debian's busybox-static, so nothing is pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
cairn=${1:-$( [ -x target/release/cairn ] && echo target/release/cairn || echo target/debug/cairn )}
kubectl=$(command -v kubectl || echo .venv/bin/kubectl)
[ -x "$cairn" ] || { echo "no cairn binary at $cairn: run cargo build --release" >&2; exit 2; }
# GPU_ROOT: a driver tree elsewhere than / (to try the script itself on a machine without a GPU).
gpu_root=${GPU_ROOT:-/}
compgen -G "$gpu_root/dev/nvidia[0-9]*" >/dev/null || [ -e "$gpu_root/dev/nvmap" ] || { echo "no NVIDIA GPU device nodes in $gpu_root/dev" >&2; exit 2; }

work=$(mktemp -d /tmp/cairn-gpu-smoke.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export KUBECONFIG=$work/kubeconfig.yaml
k() { "$kubectl" "$@"; }

image=${IMAGE:-}
if [ -z "$image" ]; then
  # A one-layer OCI image of busybox, dropped in the air-gapped images folder.
  image=docker.io/cairn-test/gpu-smoke:1
  busybox=$(command -v busybox) || { echo "busybox-static is needed: apt-get install busybox-static" >&2; exit 2; }
  root=$work/rootfs layout=$work/layout
  mkdir -p "$root/bin" "$root/tmp" "$layout/blobs/sha256" "$work/data/agent/images"
  cp "$busybox" "$root/bin/busybox"
  for a in sh ls cat echo sleep grep; do ln -s busybox "$root/bin/$a"; done
  tar -C "$root" -cf "$work/layer.tar" .
  blob() { local d; d=$(sha256sum "$1" | cut -d' ' -f1); cp "$1" "$layout/blobs/sha256/$d"; echo "$d $(stat -c %s "$1")"; }
  read -r layer layer_size < <(blob "$work/layer.tar")
  arch=$(case $(uname -m) in aarch64) echo arm64;; *) echo amd64;; esac)
  printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/bin:/usr/local/nvidia/bin"],"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$arch" "$layer" >"$work/config.json"
  read -r config config_size < <(blob "$work/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
  read -r manifest manifest_size < <(blob "$work/manifest.json")
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"1"}}]}' \
    "$manifest" "$manifest_size" "$image" >"$layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  tar -C "$layout" -cf "$work/data/agent/images/gpu-smoke.tar" .
fi

echo "== starting cairn ($cairn)"
"$cairn" server --data-dir "$work/data" --bind-address 127.0.0.1 --https-listen-port 16443 \
  --kubelet-port 0 --healthz-port 0 --kubelet-root-dir "$work/kubelet" --write-kubeconfig "$KUBECONFIG" \
  --gpu-discovery-root "$gpu_root" >"$work/cairn.log" 2>&1 &
pid=$!
for _ in $(seq 120); do
  [ "$(k get nodes -o jsonpath='{.items[0].status.allocatable.nvidia\.com/gpu}' 2>/dev/null)" != "" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/cairn.log"; exit 1; }
  sleep 1
done
grep -a "NVIDIA" "$work/cairn.log" || true
echo "== node"
k get nodes -o go-template='{{range $k, $v := .items}}{{range $l, $x := $v.metadata.labels}}{{$l}}={{$x}}{{"\n"}}{{end}}{{end}}' | grep nvidia || true
k get nodes -o jsonpath='capacity {.items[0].status.capacity.nvidia\.com/gpu}, allocatable {.items[0].status.allocatable.nvidia\.com/gpu}{"\n"}'
k get runtimeclass 2>/dev/null || true

echo "== a pod asking for one GPU ($image)"
k apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: gpu-smoke}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: $image
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo NVIDIA_VISIBLE_DEVICES=\$NVIDIA_VISIBLE_DEVICES; ls -l /dev | grep nvidia; nvidia-smi -L 2>/dev/null || /usr/local/nvidia/bin/nvidia-smi -L 2>/dev/null || echo '(nvidia-smi cannot run in this image; the device nodes above are the GPU)'"]
    resources: {limits: {nvidia.com/gpu: 1}}
YAML
k wait --for=jsonpath='{.status.phase}'=Succeeded pod/gpu-smoke --timeout=180s || { k describe pod gpu-smoke; tail -50 "$work/cairn.log"; exit 1; }
k logs gpu-smoke
k delete pod gpu-smoke --wait=true >/dev/null
echo "== ok"
