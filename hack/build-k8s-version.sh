#!/usr/bin/env bash
# Builds the components of an older Kubernetes minor that the version tests
# run (test/e2e/versions_test.go, make test-versions) from the Go module
# proxy: hack/k8s-versions/vMAJOR.MINOR pins it. Usage:
#   hack/build-k8s-version.sh v1.34 [component...]
# Components default to the control plane (kube-apiserver, kube-scheduler,
# kube-controller-manager); name kubelet too for a real node of that version.
# The binaries land in _output/k8s/<version>/ (the version read from the
# module); each is skipped when its stamp shows it was built from the same
# module and script. etcd is the one hack/build-k8s-bins.sh builds: every
# version from 1.34 speaks its v3 API.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
minor=${1:?usage: $0 v1.MINOR [component...]}
shift
components=("$@")
[ ${#components[@]} -gt 0 ] || components=(kube-apiserver kube-scheduler kube-controller-manager)
mod="$root/hack/k8s-versions/$minor"
[ -f "$mod/go.mod" ] || { echo "no module for $minor in $mod" >&2; exit 1; }
kver=$(grep -E "^require k8s.io/kubernetes v" "$mod/go.mod" | awk '{print $3}')
out="$root/_output/k8s/$kver"
want=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -d' ' -f1)
mkdir -p "$out"
m=$(echo "$kver" | cut -d. -f2)
ld="-s -w -X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$m"
cd "$mod"
for c in "${components[@]}"; do
	case "$c" in
	kube-apiserver | kube-scheduler | kube-controller-manager | kubelet) ;;
	*) echo "unknown component $c" >&2; exit 1 ;;
	esac
	stamp="$out/.$c.stamp"
	if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$out/$c" ]; then
		echo "$c $kver up to date in $out"
		continue
	fi
	echo "building $c $kver into $out (3 to 6 minutes cold on 2 cores)"
	start=$(date +%s)
	go build -trimpath -ldflags "$ld" -o "$out/$c" "k8s.io/kubernetes/cmd/$c"
	echo "$want" >"$stamp"
	echo "built $c in $(( $(date +%s) - start ))s"
done
