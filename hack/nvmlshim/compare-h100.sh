#!/usr/bin/env bash
# On a machine with a real NVIDIA H100 and its driver: reads GPU 0 the way
# dra-kubelet-plugin --nvml real does (hack/nvmlshim/nvmlprobe: pkg/nvdev's
# real backend, pkg/mig's MIG profiles and placements), once through the
# real libnvidia-ml and once through the simulated library's dgxh100, and
# prints both and the lines that differ. Read-only on the real GPU: no MIG
# mode change, no instance created.
#   hack/nvmlshim/compare-h100.sh
#   PROBE=path LIB=path: a prebuilt nvmlprobe and simulated
#   libnvidia-ml.so.1 (no Go toolchain needed); DRIVER_ROOT: the real
#   driver's root (default /); OUT: where the outputs go (default a temp dir)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}
mkdir -p "$out/sim/usr/lib64"
if [ -z "${PROBE:-}" ]; then
	go build -o "$out/nvmlprobe" ./hack/nvmlshim/nvmlprobe || exit 1
	PROBE=$out/nvmlprobe
fi
if [ -z "${LIB:-}" ]; then
	go build -buildmode=c-shared -o "$out/libnvidia-ml.so.1" ./hack/nvmlshim || exit 1
	LIB=$out/libnvidia-ml.so.1
fi
cp "$LIB" "$out/sim/usr/lib64/libnvidia-ml.so.1"

echo "== real NVML (driver root ${DRIVER_ROOT:-/})"
"$PROBE" --driver-root "${DRIVER_ROOT:-/}" describe --gpu 0 >"$out/real.txt"; echo "exit $?"
echo "== simulated library (dgxh100)"
GPUAAS_MOCK_NVML_MACHINE=dgxh100 GPUAAS_MOCK_NVML_TRACE=1 "$PROBE" --driver-root "$out/sim" describe --gpu 0 >"$out/sim.txt"; echo "exit $?"
echo "== GPU 0: real (left), simulated (right)"
diff -y -W 160 "$out/real.txt" "$out/sim.txt"
echo "== differing lines"
diff "$out/real.txt" "$out/sim.txt" && echo "none"
echo "== nvidia-smi -q -i 0 (head)"
nvidia-smi -q -i 0 2>&1 | head -40
echo "outputs in $out"
