#!/usr/bin/env bash
# Builds _output/image-base/rootfs: the runtime base of our container images,
# from Debian bookworm's packages: glibc (our cgo binaries link against it
# and dlopen the node's libnvidia-ml.so.1 at run time, which a static binary
# cannot do), the users root (0) and nonroot (65532), /tmp, and the loader
# and NSS configuration. No shell, no package manager, no docs, locales or
# iconv modules. The build runs a small cgo Go binary in the result (chroot)
# to check it is enough. It is skipped when a stamp file shows the rootfs was
# built by this same script and package list. It needs root (or sudo) for
# ldconfig -r and chroot.
set -euo pipefail

#
# IMAGE_BASE_ARCH=arm64 builds the arm64 base from bookworm's arm64
# packages (dpkg --add-architecture arm64 is done if needed), checked by
# running the probe, cross-compiled with Debian's gcc-aarch64-linux-gnu,
# under qemu-user (qemu-aarch64-static -L, no binfmt). IMAGE_BASE_OUT puts
# the result elsewhere than _output/image-base (make release: under
# _output/release). Each package's control fields are kept in the rootfs as
# distroless does (/var/lib/dpkg/status.d/<package>), for SBOMs and scanners.

# libgcc-s1 is libc6's dependency (pthread_cancel and unwinding dlopen it).
pkgs=(libc6 libgcc-s1)

root=$(cd "$(dirname "$0")/.." && pwd)
arch="${IMAGE_BASE_ARCH:-amd64}"
case "$arch" in
amd64) triplet=x86_64-linux-gnu loader=/lib64/ld-linux-x86-64.so.2 ;;
arm64) triplet=aarch64-linux-gnu loader=/lib/ld-linux-aarch64.so.1 ;;
*) echo "IMAGE_BASE_ARCH must be amd64 or arm64" >&2; exit 1 ;;
esac
native=$(dpkg --print-architecture)
if [ "$arch" != "$native" ]; then
	# Another architecture's packages, cached apart from the machine's own.
	export DEBS_CACHE="${DEBS_CACHE:-$root/_output/release/debs}"
fi
. "$root/hack/lib/debs.sh"
out="${IMAGE_BASE_OUT:-$root/_output/image-base}"
rootfs="$out/rootfs"
stamp="$out/.rootfs.stamp"
want=$(printf '%s\n' "$arch" "${pkgs[@]}" | cat - "$0" "$root/hack/lib/debs.sh" | sha256sum | cut -d' ' -f1)

debs_stamp_current "$stamp" "$want" "$rootfs/usr/lib/$triplet/libc.so.6" && { echo "image base ($arch) up to date in $rootfs"; exit 0; }

qual=""
if [ "$arch" != "$native" ]; then
	qual=":$arch"
	command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64-static >/dev/null ||
		"$root/hack/build-cross.sh"
	if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
		debs_as_root dpkg --add-architecture "$arch"
		debs_apt update -qq
	fi
fi

echo "building the image base (glibc, Debian bookworm, $arch) into $rootfs"
start=$(date +%s)
mkdir -p "$out"
# Built beside the result and renamed into place at the end, so a killed run
# never leaves a half-made rootfs.
tmp="$out/.rootfs.building"
scratch=$(mktemp -d)
debs_as_root rm -rf "$tmp"
trap 'debs_as_root rm -rf "$tmp" "$scratch"' EXIT

status_d="$scratch/status.d"
DEBS_STATUS_DIR="$status_d" debs_fetch "$tmp" "${pkgs[@]/%/$qual}"
debs_merge_usr "$tmp"
lib="$tmp/usr/lib/$triplet"
# Not needed to run a program: docs and lintian overrides, iconv modules,
# glibc's debugging and profiling preloads (libmemusage, libpcprofile,
# libc_malloc_debug, sotruss' audit module, libthread_db for debuggers) and
# its legacy libraries (libBrokenLocale, libnsl, the compat and hesiod NSS
# modules; nsswitch.conf below uses only files and dns, which glibc 2.36
# has built in). What is left: ld.so, libc, libm, libmvec, libdl, libpthread,
# librt, libresolv, libanl, libutil, the files/dns NSS stubs, libgcc_s.
rm -rf "${tmp:?}/usr/share" "$lib/gconv" "$lib/audit"
rm -f "$lib"/libmemusage.so "$lib"/libpcprofile.so "$lib"/libc_malloc_debug.so.* \
	"$lib"/libthread_db.so.* "$lib"/libBrokenLocale.so.* "$lib"/libnsl.so.* \
	"$lib"/libnss_compat.so.* "$lib"/libnss_hesiod.so.*

# Debian's identity files from base-files (the rest of it is not needed):
# NVIDIA's update-ldcache hook looks at /etc/debian_version to pick the
# container's library search paths, and scanners read os-release.
DEBS_STATUS_DIR="$status_d" debs_fetch "$scratch/base-files" "base-files$qual"
mkdir -p "$tmp/var/lib/dpkg"
cp -r "$status_d" "$tmp/var/lib/dpkg/status.d"
cp "$scratch/base-files/etc/debian_version" "$tmp/etc/"
mkdir -p "$tmp/usr/lib"
cp "$scratch/base-files/usr/lib/os-release" "$tmp/usr/lib/"
ln -s ../usr/lib/os-release "$tmp/etc/os-release"

# Users and groups: root, and nonroot (65532, as distroless) for the images
# that do not need root. Their home directories exist so $HOME is usable.
cat >"$tmp/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$tmp/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
# glibc reads this for user, group and host lookups (os/user with cgo).
cat >"$tmp/etc/nsswitch.conf" <<'EOF'
passwd:         files
group:          files
shadow:         files
hosts:          files dns
networks:       files
protocols:      files
services:       files
ethers:         files
rpc:            files
EOF
mkdir -p "$tmp/tmp" "$tmp/root" "$tmp/home/nonroot"
chmod 1777 "$tmp/tmp"
chmod 0700 "$tmp/root" "$tmp/home/nonroot"
[ "$(id -u)" != 0 ] || chown 65532:65532 "$tmp/home/nonroot"

# The loader cache as a Debian image has it; NVIDIA's update-ldcache hook
# adds the injected driver directories to it in the container.
echo 'include /etc/ld.so.conf.d/*.conf' >"$tmp/etc/ld.so.conf"
if [ "$arch" = "$native" ]; then
	ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
	debs_as_root "$ldconfig" -r "$tmp"
else
	# The target's own ldconfig (libc-bin's, static) under qemu-user: the
	# host's writes a cache for its own architecture.
	debs_fetch "$scratch/libc-bin" "libc-bin$qual"
	debs_as_root qemu-aarch64-static "$scratch/libc-bin/sbin/ldconfig" -r "$tmp"
fi

# Check: a small cgo binary finds all its libraries with the rootfs' own
# loader and runs in it, as root and as nonroot (user lookup through NSS);
# dlopen of libnvidia-ml.so.1 must fail cleanly (no driver here).
mkdir -p "$scratch/probe"
cat >"$scratch/probe/main.go" <<'EOF'
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <unistd.h>
static const char *try_nvml(void) {
	return dlopen("libnvidia-ml.so.1", RTLD_NOW) ? "loaded" : dlerror();
}
*/
import "C"

import (
	"fmt"
	"os"
	"os/user"
)

func main() {
	u, err := user.Current()
	if err != nil {
		fmt.Println("user lookup:", err)
		os.Exit(1)
	}
	fmt.Printf("pid %d user %s (%s) home %s; libnvidia-ml.so.1: %s\n",
		C.getpid(), u.Username, u.Uid, u.HomeDir, C.GoString(C.try_nvml()))
}
EOF
cc=()
[ "$arch" = "$native" ] || cc=(CC=aarch64-linux-gnu-gcc)
(cd "$scratch/probe" && GOWORK=off GOFLAGS=-mod=mod go mod init probe >/dev/null 2>&1 &&
	env "${cc[@]}" CGO_ENABLED=1 GOARCH="$arch" GOWORK=off go build -o "$tmp/.probe" .)
if [ "$arch" = "$native" ]; then
	deps=$(debs_as_root chroot "$tmp" "$loader" --list /.probe)
else
	# qemu-user with -L looks every path up in the rootfs first, as a
	# chroot would; the loader is the rootfs' own.
	deps=$(qemu-aarch64-static -L "$tmp" "$tmp$loader" --list "$tmp/.probe")
fi
if grep 'not found' <<<"$deps"; then
	echo "the cgo probe's libraries are missing in the rootfs (above)" >&2
	exit 1
fi
if [ "$arch" = "$native" ]; then
	debs_as_root chroot "$tmp" /.probe
	debs_as_root chroot --userspec=65532:65532 "$tmp" /.probe
else
	qemu-aarch64-static -L "$tmp" "$tmp/.probe"
fi
rm -f "$tmp/.probe"

debs_as_root rm -rf "$rootfs"
mv "$tmp" "$rootfs"
echo "$want" >"$stamp"
echo "built in $(($(date +%s) - start))s: $(du -sh "$rootfs" | cut -f1) in $rootfs"
