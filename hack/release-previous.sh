#!/usr/bin/env bash
# Builds the previous release (hack/release/previous: a commit and its
# version) for the upgrade test (make e2e-upgrade): its linux/amd64 image
# index and its chart, from `git archive <commit>`, into
# _output/release-previous/<commit> (or $1), as `make release` built them at
# that commit. A built one is reused: the commit fixes its sources.
#
# The image's base and nvidia-cdi-hook are the ones make release-bases and
# make release-cdi-hooks build from this tree; the script refuses when the
# scripts that build them differ from the commit's, since the old image
# would then not be the one its commit builds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
commit=$(sed -n 's/^commit=//p' hack/release/previous)
version=$(sed -n 's/^version=//p' hack/release/previous)
out=${1:-$root/_output/release-previous/$commit}
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
base=$root/_output/release/image-base-amd64/rootfs
hook=$root/_output/release/cdi-hook-amd64/nvidia-cdi-hook

if [ -s "$out/release.txt" ] && [ -f "$out/gpuaas-dra-$version.tgz" ] && [ -f "$out/image/index.json" ]; then
	echo "previous release $version (commit $commit) already built in $out"
	cat "$out/release.txt"
	exit 0
fi
if ! git diff --quiet "$commit" HEAD -- hack/build-image-base.sh hack/build-cdi-hook.sh hack/lib; then
	echo "hack/build-image-base.sh, hack/build-cdi-hook.sh or hack/lib changed since $commit:" >&2
	echo "the previous release's base and hook must be built from its own tree" >&2
	exit 1
fi
for f in "$base" "$hook" "$bin/helm"; do
	[ -e "$f" ] || { echo "$f missing: make release-bases release-cdi-hooks helm" >&2; exit 1; }
done

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git archive "$commit" | tar -x -C "$src"
rm -rf "$out" "$out.tmp"
mkdir -p "$out.tmp"
export CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}
# No git in the archive: the version and commit are given, as make release
# gives them from hack/version.sh at that commit.
(cd "$src" && go run ./hack/release --version "$version" --revision "$commit" \
	--source-date-epoch "$(git -C "$root" log -1 --format=%ct "$commit")" \
	--repository "${IMAGE:-ghcr.io/gpuaas/gpu-dra-driver}" --helm "$bin/helm" \
	--platform "amd64=$base,$hook" --out "$out.tmp") | tee "$out.tmp/release.txt.tmp" ||
	{ rm -rf "$out.tmp"; exit 1; }
sed "s|\.tmp/|/|g" "$out.tmp/release.txt.tmp" >"$out.tmp/release.txt"
rm "$out.tmp/release.txt.tmp"
rm -rf "$out"
mv "$out.tmp" "$out"
