#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU: prints the devices dra-kubelet-plugin
# would publish (hack/inventory, real NVML) beside what nvidia-smi reports,
# so the two can be compared by eye, and what the driver watch and a release
# of the GPUs see (hack/driverrelease). Read-only: no MIG mode change, no GPU
# or compute instance created, no reset.
#   hack/compare-real-gpu.sh [--driver-root /] [--node-config file]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$(mktemp -d)}
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
(cd "$root" && go build -o "$out/inventory" ./hack/inventory && go build -o "$out/driverrelease" ./hack/driverrelease)
{
	echo "== nvidia-smi -L"; nvidia-smi -L
	echo "== nvidia-smi -q"; nvidia-smi -q
	echo "== nvidia-smi mig -lgip"; nvidia-smi mig -lgip || echo "(no MIG support or MIG mode off)"
} >"$out/nvidia-smi.txt" 2>&1
"$out/inventory" --nvml real "$@" >"$out/inventory.yaml"
echo "== what the plugin publishes ($out/inventory.yaml)"
grep -E '^# |name:|productName|uuid|memory|profile|migCapable|cudaComputeCapability|driverVersion|index' "$out/inventory.yaml" | head -200
echo "== what nvidia-smi says ($out/nvidia-smi.txt)"
grep -E '^GPU |Product Name|GPU UUID|MIG Mode|Current *:|FB Memory Usage|Total *:|Driver Version|CUDA Version|Minor Number|Bus Id' "$out/nvidia-smi.txt" | head -100
sed -n '/nvidia-smi mig -lgip/,$p' "$out/nvidia-smi.txt" | head -60
echo "== the driver watch and --release-gpus (issue 25 item 4)"
driver_root=/
for ((i = 1; i <= $#; i++)); do [[ ${!i} == --driver-root ]] && { j=$((i + 1)); driver_root=${!j}; }; done
"$out/driverrelease" --driver-root "$driver_root"
