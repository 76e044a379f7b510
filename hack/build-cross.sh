#!/usr/bin/env bash
# Installs what the arm64 half of a release needs from Debian bookworm, when
# missing: the C cross compiler cgo uses (gcc-aarch64-linux-gnu, with the
# arm64 glibc headers and libraries of libc6-dev-arm64-cross) and
# qemu-user-static, which runs the arm64 binaries here without binfmt
# (qemu-aarch64-static -L <arm64 rootfs>). Needs root (or sudo).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/hack/lib/debs.sh"
pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || { echo "cross tools installed (${pkgs[*]})"; exit 0; }
echo "installing ${missing[*]}"
debs_apt update -qq
DEBIAN_FRONTEND=noninteractive debs_apt install -y -qq --no-install-recommends "${missing[@]}"
