#!/usr/bin/env bash
# Builds and tests the kubelet plugin on the next Kubernetes minor's
# libraries (issue 57), without touching the project's go.mod: a copy of
# go.mod and go.sum in _output/plugin-next has every k8s.io module the
# plugin imports moved to the 0.38 release, and the go command reads that
# copy (-modfile) over the same source tree. What the two library versions
# differ in sits behind the k8s138 build tag, one small file per version
# (pkg/plugin/prepare/preparetest/libraries*.go). Usage:
#   hack/plugin-next.sh [STAGING_VERSION]     (default v0.38.0-beta.0)
# It builds cmd/dra-kubelet-plugin, checks that every k8s.io module the
# binary links is at that version, and runs go test on every package of
# this module the binary links (pkg/plugin/..., pkg/cdi, pkg/mps,
# pkg/sliceprobe, pkg/deviceweight, ...). Exit status: go's.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${1:-${PLUGIN_NEXT_VERSION:-v0.38.0-beta.0}}
# The 1.38 modules say go 1.27.0 (docs/development.md): the go command
# fetches this toolchain from the module proxy.
toolchain=${PLUGIN_NEXT_TOOLCHAIN:-go1.27.4}
dir=$root/_output/plugin-next
mkdir -p "$dir"
before=$(sha256sum go.mod go.sum)

cp go.mod "$dir/go.mod"
cp go.sum "$dir/go.sum"
# The modules the plugin imports; the others (component-base, ...) follow
# from their requirements. The controller's own (controller-runtime,
# apiextensions-apiserver) stay: the plugin does not link them.
edits=(-go=1.27.0)
for m in api apimachinery apiserver client-go dynamic-resource-allocation kubelet; do
	edits+=("-require=k8s.io/$m@$version")
done
# The proxy refuses structured-merge-diff v7.0.1, which the 1.38 modules
# require; v7.0.0 is served (hack/k8s-next-check.sh, docs/development.md).
edits+=(-replace=sigs.k8s.io/structured-merge-diff/v7@v7.0.1=sigs.k8s.io/structured-merge-diff/v7@v7.0.0)
go mod edit "${edits[@]}" "$dir/go.mod"

export GOTOOLCHAIN=$toolchain GOFLAGS="-mod=mod -modfile=$dir/go.mod -tags=k8s138 ${GOFLAGS:-}"
echo "plugin-next: k8s.io modules at $version, $(go version | cut -d' ' -f3), modfile $dir/go.mod"

start=$SECONDS
go build -o "$dir/dra-kubelet-plugin" ./cmd/dra-kubelet-plugin
echo "plugin-next: built cmd/dra-kubelet-plugin in $((SECONDS - start)) s"

# The move is real: every k8s.io module the binary links is at $version
# (k8s.io/klog, k8s.io/utils and k8s.io/kube-openapi have releases of their own).
stale=$(go list -deps -f '{{with .Module}}{{.Path}} {{.Version}}{{end}}' ./cmd/dra-kubelet-plugin | sort -u |
	awk -v v="$version" '$1 ~ /^k8s\.io\// && $1 !~ /^k8s\.io\/(klog|utils|kube-openapi)/ && $2 != v')
if [ -n "$stale" ]; then
	echo "plugin-next: the plugin links k8s.io modules not at $version:" >&2
	echo "$stale" >&2
	exit 1
fi

module=$(go list -m)
pkgs=$(go list -deps ./cmd/dra-kubelet-plugin | grep "^$module/" | grep -v "^$module/cmd/")
start=$SECONDS
# -p 2: this is a shared build machine; raise it with PLUGIN_NEXT_TEST_FLAGS.
# shellcheck disable=SC2086
go test -count=1 ${PLUGIN_NEXT_TEST_FLAGS:--p 2} $pkgs
echo "plugin-next: tested $(wc -w <<<"$pkgs") packages in $((SECONDS - start)) s"

after=$(sha256sum go.mod go.sum)
if [ "$before" != "$after" ]; then
	echo "plugin-next: go.mod or go.sum changed; it must not" >&2
	exit 1
fi
