#!/usr/bin/env bash
# Builds kwok, which keeps the scale benchmark's hundreds of fake Nodes Ready
# and runs their pods (issue 14), from the Go module proxy into
# _output/bin/kwok, with the stages it plays (node-fast, node heartbeat by
# lease, pod-fast: what kwokctl runs by default) in _output/kwok/stages. The
# build is skipped when a stamp file shows it was built
# from the same version and script.
#
# As for Kueue (hack/build-kueue.sh), `go install ...@VERSION` needs the
# module's version list, which the proxy refuses; so the one pinned module is
# downloaded and built in a copy of itself, with its own go.mod and go.sum.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
out="$root/_output/kwok"
version="${KWOK_VERSION:-v0.8.0}"
stamp="$bin/.kwok.stamp"
want=$(printf '%s\n' "$version" | cat - "$0" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin/kwok" ] && [ -d "$out/stages" ]; then
	echo "kwok $version up to date in $bin"
	exit 0
fi

mkdir -p "$bin"
echo "building kwok $version into $bin (a few minutes cold on 2 cores)"
start=$(date +%s)
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
# Outside any module, so this repository's go.mod is not touched.
src=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$version" |
	sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "downloading sigs.k8s.io/kwok@$version failed" >&2; exit 1; }
cp -r "$src" "$tmp/kwok"
chmod -R u+w "$tmp/kwok"
(cd "$tmp/kwok" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/kwok" ./cmd/kwok)
rm -rf "$out/stages"
mkdir -p "$out/stages"
stages="$src/kustomize/stage"
cp "$stages/node/fast/node-initialize.yaml" "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
	"$stages"/pod/fast/pod-*.yaml "$out/stages/"
echo "$version" >"$out/VERSION"
echo "$want" >"$stamp"
echo "built in $(( $(date +%s) - start ))s"
