#!/usr/bin/env bash
# Builds the Kueue manager the e2e queueing tests and the demo's queueing
# scenario run, from the Go module proxy, into _output/bin/kueue, and copies
# its CRDs and webhook manifests into _output/kueue. The build is skipped when
# a stamp file shows it was built from the same version and script.
# hack/lib/pinned-module.sh says why this is not `go install`.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
out="$root/_output/kueue"
version="${KUEUE_VERSION:-v0.19.2}"
stamp="$bin/.kueue.stamp"
want=$(printf '%s\n' "$version" | cat - "$0" "$root/hack/lib/pinned-module.sh" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin/kueue" ] && [ -d "$out/crds" ]; then
	echo "kueue $version up to date in $bin"
	exit 0
fi

mkdir -p "$bin" "$out"
echo "building kueue $version into $bin (about 10 minutes cold on 2 cores)"
start=$(date +%s)
. "$root/hack/lib/pinned-module.sh"
pinned_build "sigs.k8s.io/kueue" "$version" cmd/kueue "$bin/kueue"
src=$PINNED_SRC
rm -rf "$out/crds" "$out/webhook"
mkdir -p "$out/crds" "$out/webhook"
cp "$src"/config/components/crd/bases/*.yaml "$out/crds/"
cp "$src"/config/components/webhook/manifests.yaml "$out/webhook/"
echo "$version" >"$out/VERSION"
echo "$want" >"$stamp"
echo "built in $(( $(date +%s) - start ))s"
