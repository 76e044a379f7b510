#!/usr/bin/env bash
# Builds the Kubernetes control plane the e2e tests and `make demo` run
# (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl)
# and the kubelet of the real node (test/e2e/framework StartRealNode)
# from the Go module proxy into _output/bin. The build is skipped when a stamp
# file shows the binaries were built from the same go.sum and script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/hack/k8s-bins"
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
stamp="$bin/.k8s-bins.stamp"
want=$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -d' ' -f1)

bins=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet)
have_all() { for b in "${bins[@]}"; do [ -x "$bin/$b" ] || return 1; done; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && have_all; then
	echo "k8s control plane up to date in $bin"
	exit 0
fi

mkdir -p "$bin"
kver=$(grep -E "^\s*k8s.io/kubernetes v" "$mod/go.mod" | awk "{print \$2}")
minor=$(echo "$kver" | cut -d. -f2)
ld="-s -w -X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
echo "building Kubernetes $kver control plane into $bin (about 15 minutes cold on 2 cores)"
start=$(date +%s)
cd "$mod"
go build -trimpath -ldflags "$ld" -o "$bin/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kubectl \
	k8s.io/kubernetes/cmd/kubelet
# Built on its own: with -o dir/ the etcd main package comes out named "server".
go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
echo "$want" >"$stamp"
echo "built in $(( $(date +%s) - start ))s"
