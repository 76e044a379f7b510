#!/usr/bin/env bash
# Builds what a real node runs besides the kubelet (built with the control
# plane by build-k8s-bins.sh): containerd, its runc shim, ctr and runc, from
# the Go module proxy into _output/bin, and installs the CNI plugins from
# Debian when /usr/lib/cni has none. The build is skipped when a stamp file
# shows the binaries were built by this same script (which pins the
# versions). See shared/notes/real-node.md.
set -euo pipefail

CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.2

root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
stamp="$bin/.node-bins.stamp"
want=$(sha256sum "$0" | cut -d' ' -f1)

bins=(containerd containerd-shim-runc-v2 ctr runc)
have_all() { for b in "${bins[@]}"; do [ -x "$bin/$b" ] || return 1; done; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# runc needs libseccomp (without it every sandbox fails "seccomp not
# supported"); the loopback CNI plugin lets containerd report the network ready.
pkgs=()
pkg-config --exists libseccomp 2>/dev/null || pkgs+=(libseccomp-dev pkg-config)
[ -x /usr/lib/cni/loopback ] || pkgs+=(containernetworking-plugins)
if [ ${#pkgs[@]} -gt 0 ]; then
	echo "installing ${pkgs[*]}"
	as_root apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && have_all; then
	echo "node binaries (containerd $CONTAINERD_VERSION, runc $RUNC_VERSION) up to date in $bin"
	exit 0
fi

mkdir -p "$bin"
echo "building containerd $CONTAINERD_VERSION and runc $RUNC_VERSION into $bin (about 4 minutes cold on 2 cores)"
start=$(date +%s)
# Outside any module: go install pkg@version resolves the release's own go.mod.
cd /
GOBIN="$bin" GOFLAGS=-tags=no_btrfs go install -trimpath -ldflags "-s -w" \
	github.com/containerd/containerd/v2/cmd/containerd@"$CONTAINERD_VERSION" \
	github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@"$CONTAINERD_VERSION" \
	github.com/containerd/containerd/v2/cmd/ctr@"$CONTAINERD_VERSION"
GOBIN="$bin" GOFLAGS=-tags=seccomp go install -trimpath -ldflags "-s -w" \
	github.com/opencontainers/runc@"$RUNC_VERSION"
echo "$want" >"$stamp"
echo "built in $(( $(date +%s) - start ))s"
