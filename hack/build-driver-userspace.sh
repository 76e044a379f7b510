#!/usr/bin/env bash
# Builds _output/driver-userspace/host: NVIDIA's real driver userspace,
# 535.261.03, laid out as a host install (what NVIDIA's .run installer or the
# GPU Operator's driver container gives): every NVIDIA library's versioned
# file directly in usr/lib/x86_64-linux-gnu with the .so.1 links and
# etc/ld.so.cache made by ldconfig, nvidia-smi and the MPS binaries in
# usr/bin, plus the glibc they run on, so `chroot ROOT /usr/bin/nvidia-smi`
# works. With no GPU these binaries fail exactly where the kernel module is
# missing (nvidia-smi exits 9, cuInit 100, nvmlInit 9), which makes this the
# most realistic driver root a test can use here. Device nodes are left to
# the tests (mknod). See shared/notes/real-driver-userspace.md.
#
# The files come from Debian bookworm's packages (non-free for NVIDIA's),
# unpacked, never installed. The build is skipped when a stamp file shows the
# root was built by this same script and package list. It needs root (or
# sudo) for ldconfig -r and the chroot check.
set -euo pipefail

DRIVER_VERSION=535.261.03
# NVIDIA's packages, at the driver version (any Debian revision of it).
# libcuda1's libnvidia-pkcs11-openssl3 is only for confidential computing
# and would pull in OpenSSL, so it is left out.
nvidia_pkgs=(libcuda1 libnvidia-ml1 nvidia-smi nvidia-cuda-mps libnvidia-ptxjitcompiler1)
# What the binaries and libraries need from Debian main: they link only
# against glibc (libc, libm, libdl, libpthread, librt); libgcc-s1 is libc6's
# own dependency (pthread_cancel dlopens it).
base_pkgs=(libc6 libgcc-s1)
bins=(nvidia-smi nvidia-cuda-mps-control nvidia-cuda-mps-server)

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/hack/lib/debs.sh"
out="$root/_output/driver-userspace"
host="$out/host"
stamp="$out/.host.stamp"
want=$(printf '%s\n' "$DRIVER_VERSION" "${nvidia_pkgs[@]}" "${base_pkgs[@]}" |
	cat - "$0" "$root/hack/lib/debs.sh" | sha256sum | cut -d' ' -f1)

debs_stamp_current "$stamp" "$want" "$host/usr/bin/nvidia-smi" && { echo "driver userspace $DRIVER_VERSION up to date in $host"; exit 0; }

echo "building the NVIDIA driver userspace $DRIVER_VERSION (host layout) into $host"
start=$(date +%s)
mkdir -p "$out"
# Built beside the result and renamed into place at the end, so a killed run
# never leaves a half-made root where the tests look.
tmp="$out/.host.building"
debs_as_root rm -rf "$tmp"
trap 'debs_as_root rm -rf "$tmp"' EXIT

specs=("${base_pkgs[@]}")
for p in "${nvidia_pkgs[@]}"; do specs+=("$p=$DRIVER_VERSION-*"); done
debs_fetch "$tmp" "${specs[@]}"
debs_merge_usr "$tmp"

# Debian's layout puts NVIDIA's files behind its alternatives system
# (usr/lib/x86_64-linux-gnu/nvidia/current, usr/lib/nvidia/current); a host
# install has them flat. Only the real files move; the links are remade by
# ldconfig below, as on a host.
lib="$tmp/usr/lib/x86_64-linux-gnu"
find "$lib/nvidia/current" -maxdepth 1 -type f -name '*.so.*' -exec mv -t "$lib" {} +
rm -rf "$lib/nvidia"
mv "$tmp/usr/lib/nvidia/current/nvidia-smi" "$tmp/usr/bin/"
rm -rf "$tmp/usr/lib/nvidia"
mv "$tmp/usr/sbin/nvidia-cuda-mps-server" "$tmp/usr/bin/"
# Not needed to run anything: docs, man pages, bug-report scripts, lintian
# overrides, and glibc's iconv modules (7 MB).
rm -rf "${tmp:?}/usr/share" "$lib/gconv"
# A host's empty mount points, so a test can chroot here: the MPS control
# daemon exits 1 without /dev/null (the tests mknod it with the GPU nodes)
# and keeps its pipes under /tmp; it does not need /proc.
mkdir -p "$tmp/dev" "$tmp/proc" "$tmp/sys" "$tmp/run" "$tmp/tmp"
chmod 1777 "$tmp/tmp"

# A host's loader configuration; `ldconfig -r` reads it inside the root and
# makes the soname links (libcuda.so.1 -> libcuda.so.535.261.03, ...) and
# etc/ld.so.cache, which nvcdi and the CDI hooks read.
cat >"$tmp/etc/ld.so.conf" <<'EOF'
/usr/lib/x86_64-linux-gnu
/lib/x86_64-linux-gnu
include /etc/ld.so.conf.d/*.conf
EOF
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
debs_as_root "$ldconfig" -r "$tmp"
# The unversioned development links NVIDIA's installer also makes.
ln -s libcuda.so.1 "$lib/libcuda.so"
ln -s libnvidia-ml.so.1 "$lib/libnvidia-ml.so"

# Checks: no link left into Debian's alternatives, the soname links exist,
# and every binary's libraries resolve inside the root (with the root's own
# loader, so nothing of the machine's / can stand in).
if find "$tmp" -type l -lname '*alternatives*' -o -type l -lname '*nvidia/current*' | grep .; then
	echo "links into Debian's alternatives are left (above)" >&2
	exit 1
fi
for so in libcuda.so.1 libnvidia-ml.so.1 libnvidia-ptxjitcompiler.so.1; do
	[ -f "$lib/$so" ] || { echo "ldconfig made no $so" >&2; exit 1; }
done
for b in "${bins[@]}"; do
	if [ ! -f "$tmp/usr/bin/$b" ] || [ -L "$tmp/usr/bin/$b" ]; then
		echo "usr/bin/$b is not a file" >&2
		exit 1
	fi
	deps=$(debs_as_root chroot "$tmp" /lib64/ld-linux-x86-64.so.2 --list "/usr/bin/$b")
	if grep 'not found' <<<"$deps"; then
		echo "usr/bin/$b: libraries missing in the root (above)" >&2
		exit 1
	fi
done

debs_as_root rm -rf "$host"
mv "$tmp" "$host"
echo "$DRIVER_VERSION" >"$out/VERSION"
echo "$want" >"$stamp"
echo "built in $(($(date +%s) - start))s: $(du -sh "$host" | cut -f1) in $host"
