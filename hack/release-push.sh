#!/usr/bin/env bash
# Pushes a built release (make release) to REGISTRY: the multi-architecture
# image index (the OCI layout image/) as REGISTRY/gpuaas/gpu-dra-driver:VERSION
# with crane, and the chart as oci://REGISTRY/gpuaas/charts/gpuaas-dra:VERSION
# (its OCI layout chart/ with crane; helm push for a release without one).
# A registry on 127.0.0.1 or localhost is spoken to over plain HTTP. Prints
# what a user installs.
set -euo pipefail
registry=$1 dir=$2 version=$3
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
insecure=() plain=()
case "$registry" in 127.0.0.1:* | localhost:* | localhost | 127.0.0.1) insecure=(--insecure) plain=(--plain-http) ;; esac
image="$registry/gpuaas/gpu-dra-driver:$version"
"$bin/crane" push "${insecure[@]}" "$dir/image" "$image"
digest=$("$bin/crane" digest "${insecure[@]}" "$image")
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
chart="$registry/gpuaas/charts/gpuaas-dra:$version"
if [ -d "$dir/chart" ]; then
	# The chart's OCI artifact as the release wrote it: the same digest
	# every time (helm push dates the manifest with the time of the push).
	"$bin/crane" push "${insecure[@]}" "$dir/chart" "$chart"
else
	# A release built before the layout existed (hack/release/previous).
	HELM_CONFIG_HOME=$home HELM_CACHE_HOME=$home HELM_DATA_HOME=$home \
		"$bin/helm" push "${plain[@]}" "$dir/gpuaas-dra-$version.tgz" "oci://$registry/gpuaas/charts"
fi
echo "image: $image@$digest"
echo "chart: oci://$chart@$("$bin/crane" digest "${insecure[@]}" "$chart")"
echo "install: helm install gpuaas-dra oci://$registry/gpuaas/charts/gpuaas-dra --version $version \\"
echo "  --namespace gpuaas-dra --create-namespace --set image.repository=$registry/gpuaas/gpu-dra-driver --set image.digest=$digest"
