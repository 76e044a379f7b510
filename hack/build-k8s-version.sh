#!/usr/bin/env bash
# Builds the kube-apiserver of an older Kubernetes minor that the version
# tests run (test/e2e/versions_test.go, make test-versions) from the Go module
# proxy: hack/k8s-versions/vMAJOR.MINOR pins it. Usage:
#   hack/build-k8s-version.sh v1.34
# The binary lands in _output/k8s/<version>/ (the version read from the
# module), skipped when a stamp shows it was built from the same module and
# script. etcd is the one hack/build-k8s-bins.sh builds: every version from
# 1.34 speaks its v3 API.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
minor=${1:?usage: $0 v1.MINOR}
mod="$root/hack/k8s-versions/$minor"
[ -f "$mod/go.mod" ] || { echo "no module for $minor in $mod" >&2; exit 1; }
kver=$(grep -E "^require k8s.io/kubernetes v" "$mod/go.mod" | awk '{print $3}')
out="$root/_output/k8s/$kver"
stamp="$out/.stamp"
want=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$out/kube-apiserver" ]; then
	echo "kube-apiserver $kver up to date in $out"
	exit 0
fi
mkdir -p "$out"
m=$(echo "$kver" | cut -d. -f2)
ld="-s -w -X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$m"
echo "building kube-apiserver $kver into $out (about 6 minutes cold on 2 cores)"
start=$(date +%s)
cd "$mod"
go build -trimpath -ldflags "$ld" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
echo "$want" >"$stamp"
echo "built in $(( $(date +%s) - start ))s"
