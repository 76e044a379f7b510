#!/usr/bin/env bash
# Builds the Kueue manager the e2e queueing tests and the demo's queueing
# scenario run, from the Go module proxy, into _output/bin/kueue, and copies
# its CRDs and webhook manifests into _output/kueue. The build is skipped when
# a stamp file shows it was built from the same version and script.
#
# `go install sigs.k8s.io/kueue/cmd/kueue@VERSION` does not work here: it asks
# the proxy for the module's version list (for deprecations), which the proxy
# refuses. So the one pinned module is downloaded and built in a copy of
# itself, with its own go.mod and go.sum, exactly as Kueue's release is.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
out="$root/_output/kueue"
version="${KUEUE_VERSION:-v0.19.2}"
stamp="$bin/.kueue.stamp"
want=$(printf '%s\n' "$version" | cat - "$0" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin/kueue" ] && [ -d "$out/crds" ]; then
	echo "kueue $version up to date in $bin"
	exit 0
fi

mkdir -p "$bin" "$out"
echo "building kueue $version into $bin (about 10 minutes cold on 2 cores)"
start=$(date +%s)
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
# Outside any module, so this repository's go.mod is not touched.
src=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$version" |
	sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "downloading sigs.k8s.io/kueue@$version failed" >&2; exit 1; }
cp -r "$src" "$tmp/kueue"
chmod -R u+w "$tmp/kueue"
(cd "$tmp/kueue" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/kueue" ./cmd/kueue)
rm -rf "$out/crds" "$out/webhook"
mkdir -p "$out/crds" "$out/webhook"
cp "$src"/config/components/crd/bases/*.yaml "$out/crds/"
cp "$src"/config/components/webhook/manifests.yaml "$out/webhook/"
echo "$version" >"$out/VERSION"
echo "$want" >"$stamp"
echo "built in $(( $(date +%s) - start ))s"
