#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU: prints the devices dra-kubelet-plugin
# would publish (hack/inventory, real NVML) beside what nvidia-smi reports,
# so the two can be compared by eye, and what issue 25 items 1, 2 and 4
# would meet here (hack/inventory --checks, /proc):
#   item 1: per GPU, whether the plugin's per-GPU read succeeds, or its
#           report of the GPU it leaves out;
#   item 2: per GPU, MIG mode current and pending, whether the architecture
#           switches MIG mode without a reset, the minor number, and the
#           processes NVML sees on it (what makes SetMigMode answer IN_USE);
#   item 4: the driver version NVML reports beside the installed
#           libnvidia-ml's and the loaded kernel module's, and which
#           processes hold /dev/nvidia* open (what blocks rmmod nvidia and
#           nvidia-smi -r).
#   and what the driver watch and a release of the GPUs see
#   (hack/driverrelease), and what a container with the plugin's CDI spec
#   for GPU 0 gets: libcuda.so.1 loaded from the injected driver files and
#   cuInit's answer, 0 on a real GPU (hack/gpucontainer: runc,
#   nvidia-cdi-hook and test/images/gpuinfo on the image's base).
# Read-only: no MIG mode change, no GPU or compute instance created, no
# reset, no module unloaded.
#   hack/compare-real-gpu.sh [--driver-root /] [--node-config file]
#   INVENTORY=path, DRIVERRELEASE=path, GPUCONTAINER=path, GPUINFO=path:
#   prebuilt hack/inventory, hack/driverrelease, hack/gpucontainer and
#   test/images/gpuinfo (no Go toolchain needed); RUNC, CDI_HOOK, ROOTFS:
#   runc, nvidia-cdi-hook and the image base's rootfs (default: _output's);
#   DEV_ROOT: where /dev/nvidia* are when not under the driver root
set -euo pipefail
# What is printed is for reading: a section with nothing to show (grep
# finding no line) or cut short (head) does not end the script.
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
driver_root=/
args=("$@")
while [ $# -gt 0 ]; do
	case $1 in
	--driver-root) driver_root=$2; shift 2 ;;
	--driver-root=*) driver_root=${1#*=}; shift ;;
	*) shift ;;
	esac
done
inventory=${INVENTORY:-}
if [ -z "$inventory" ]; then
	export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
	(cd "$root" && go build -o "$out/inventory" ./hack/inventory)
	inventory=$out/inventory
fi
driverrelease=${DRIVERRELEASE:-}
if [ -z "$driverrelease" ]; then
	export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
	(cd "$root" && go build -o "$out/driverrelease" ./hack/driverrelease)
	driverrelease=$out/driverrelease
fi
gpucontainer=${GPUCONTAINER:-}
if [ -z "$gpucontainer" ]; then
	(cd "$root" && go build -o "$out/gpucontainer" ./hack/gpucontainer)
	gpucontainer=$out/gpucontainer
fi
gpuinfo=${GPUINFO:-}
if [ -z "$gpuinfo" ]; then
	(cd "$root" && go build -trimpath -o "$out/gpuinfo" ./test/images/gpuinfo)
	gpuinfo=$out/gpuinfo
fi
{
	echo "== nvidia-smi -L"; nvidia-smi -L || true
	echo "== nvidia-smi -q"; nvidia-smi -q || true
	echo "== nvidia-smi mig -lgip"; nvidia-smi mig -lgip || echo "(no MIG support or MIG mode off)"
	echo "== nvidia-smi --query-gpu"
	nvidia-smi --query-gpu=index,uuid,pci.bus_id,mig.mode.current,mig.mode.pending,driver_version --format=csv || true
	echo "== nvidia-smi --query-compute-apps"
	nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv || true
} >"$out/nvidia-smi.txt" 2>&1
# The checks are a second YAML document after the devices; a failure to
# render them must not hide the devices.
"$inventory" --nvml real --checks --health 8s "${args[@]}" >"$out/inventory.yaml" 2>"$out/inventory.stderr" || {
	echo "== hack/inventory failed (exit $?):"; cat "$out/inventory.stderr"
}
sed -n '1,/^---$/p' "$out/inventory.yaml" | sed '$d' >"$out/devices.yaml"
sed -n '/^---$/,$p' "$out/inventory.yaml" >"$out/checks.yaml"

echo "== what the plugin publishes ($out/devices.yaml)"
grep -E '^# |name:|productName|uuid|memory|profile|migCapable|cudaComputeCapability|driverVersion|index|minor' "$out/devices.yaml" | head -200 || true
echo "== what nvidia-smi says ($out/nvidia-smi.txt)"
grep -E '^GPU |Product Name|GPU UUID|MIG Mode|Current *:|Pending *:|FB Memory Usage|Total *:|Driver Version|CUDA Version|Minor Number|Bus Id' "$out/nvidia-smi.txt" | head -100 || true
sed -n '/nvidia-smi mig -lgip/,$p' "$out/nvidia-smi.txt" | head -80 || true

echo "== issue 25 items 1, 2, 4 as the plugin would meet them, and its health monitor ($out/checks.yaml)"
cat "$out/checks.yaml"

echo "== item 4: the loaded kernel module (/proc/driver/nvidia/version)"
cat /proc/driver/nvidia/version 2>/dev/null || echo "(not loaded)"
echo "== item 4: nvidia modules and their use counts (/proc/modules)"
grep -E '^nvidia' /proc/modules 2>/dev/null || echo "(none loaded)"
echo "== item 4: libnvidia-ml under the driver root $driver_root"
for dir in usr/lib64 usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu usr/lib lib64; do
	for f in "$driver_root/$dir"/libnvidia-ml.so*; do
		[ -e "$f" ] || continue
		printf '%s -> %s\n' "$f" "$(readlink -f "$f")"
	done
done
echo "== item 4: processes holding /dev/nvidia* open (what blocks rmmod nvidia and nvidia-smi -r)"
# Reading /proc/<pid>/fd of other users' processes needs root; without it
# those processes are missed, and the count of unreadable ones says so.
unreadable=0
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	[ "$pid" = "$$" ] && continue
	if ! nodes=$(find "$p/fd" -maxdepth 1 -type l -printf '%l\n' 2>/dev/null); then
		unreadable=$((unreadable + 1))
		continue
	fi
	nodes=$(printf '%s\n' "$nodes" | grep -E '^/dev/nvidia' | sort -u | tr '\n' ' ' || true)
	[ -n "$nodes" ] || continue
	comm=$(cat "$p/comm" 2>/dev/null || echo '?')
	printf 'pid %s (%s): %s\n' "$pid" "$comm" "$nodes"
done
[ "$unreadable" -eq 0 ] || echo "($unreadable processes could not be read: run as root to see them all)"
echo "== item 4: the driver watch and --release-gpus (hack/driverrelease)"
"$driverrelease" --driver-root "$driver_root" || true
echo "== a container with the plugin's CDI spec for GPU 0 (hack/gpucontainer)"
"$gpucontainer" --driver-root "$driver_root" ${DEV_ROOT:+--dev-root "$DEV_ROOT"} --gpuinfo "$gpuinfo" \
	--runc "${RUNC:-$root/_output/bin/runc}" --cdi-hook "${CDI_HOOK:-$root/_output/bin/nvidia-cdi-hook}" \
	--rootfs "${ROOTFS:-$root/_output/image-base/rootfs}" --work "$out/gpucontainer.d" || true
