#!/usr/bin/env bash
# Builds kwok, which keeps the scale benchmark's hundreds of fake Nodes Ready
# and runs their pods (issue 14), from the Go module proxy into
# _output/bin/kwok, with the stages it plays (node-fast, node heartbeat by
# lease, pod-fast: what kwokctl runs by default) in _output/kwok/stages. The
# build is skipped when a stamp file shows it was built
# from the same version and script.
#
# hack/lib/pinned-module.sh says why this is not `go install`.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
out="$root/_output/kwok"
version="${KWOK_VERSION:-v0.8.0}"
stamp="$bin/.kwok.stamp"
want=$(printf '%s\n' "$version" | cat - "$0" "$root/hack/lib/pinned-module.sh" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin/kwok" ] && [ -d "$out/stages" ]; then
	echo "kwok $version up to date in $bin"
	exit 0
fi

mkdir -p "$bin"
echo "building kwok $version into $bin (a few minutes cold on 2 cores)"
start=$(date +%s)
. "$root/hack/lib/pinned-module.sh"
pinned_build "sigs.k8s.io/kwok" "$version" cmd/kwok "$bin/kwok"
src=$PINNED_SRC
rm -rf "$out/stages"
mkdir -p "$out/stages"
stages="$src/kustomize/stage"
cp "$stages/node/fast/node-initialize.yaml" "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
	"$stages"/pod/fast/pod-*.yaml "$out/stages/"
echo "$version" >"$out/VERSION"
echo "$want" >"$stamp"
echo "built in $(( $(date +%s) - start ))s"
