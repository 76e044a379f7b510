#!/usr/bin/env bash
# Builds NVIDIA's nvidia-cdi-hook into _output/bin, from the
# github.com/NVIDIA/nvidia-container-toolkit version go.mod requires (the
# module our CDI specs come from). The CDI specs name it as the hook that
# makes the .so.1 links (create-symlinks) and the loader cache
# (update-ldcache) in a container; runc runs it on the host, so it is linked
# statically and runs whatever the host's libc. The build is skipped when a
# stamp file shows the same version, linking and script.
#
# It cannot be built with CGO_ENABLED=0: its apply-cuda-memory-limits
# command imports go-nvml, which is cgo only. So it is built with cgo and
# linked statically against glibc (needs gcc and libc6-dev's libc.a). The
# one cost: in a static binary, dlopen of the real libnvidia-ml crashes
# (SIGSEGV, PC=0 in nvmlInit), so apply-cuda-memory-limits must not be used
# with this build; CDI_HOOK_LINK=dynamic builds an ordinary glibc-linked
# hook, as NVIDIA ships, where it works. See
# shared/notes/real-driver-userspace.md.
#
# CDI_HOOK_ARCH=arm64 cross-compiles the arm64 hook of a release (Debian's
# gcc-aarch64-linux-gnu; hack/build-cross.sh installs it) and checks it
# under qemu-user; make release puts it under _output/release (KUBE_BIN_DIR).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
arch="${CDI_HOOK_ARCH:-$(go env GOHOSTARCH)}"
cc=gcc run=()
if [ "$arch" != "$(go env GOHOSTARCH)" ]; then
	[ "$arch" = arm64 ] || { echo "CDI_HOOK_ARCH must be amd64 or arm64" >&2; exit 1; }
	command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64-static >/dev/null ||
		"$root/hack/build-cross.sh"
	cc=aarch64-linux-gnu-gcc run=(qemu-aarch64-static)
fi
module=github.com/NVIDIA/nvidia-container-toolkit
link="${CDI_HOOK_LINK:-static}"
case "$link" in static | dynamic) ;; *) echo "CDI_HOOK_LINK must be static or dynamic" >&2; exit 1 ;; esac
version=$(awk -v m="$module" '$1 == m { print $2 } $1 == "require" && $2 == m { print $3 }' "$root/go.mod" | head -n1)
[ -n "$version" ] || { echo "no $module in go.mod" >&2; exit 1; }
stamp="$bin/.nvidia-cdi-hook.stamp"
want="$version $link $arch $(sha256sum "$0" | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin/nvidia-cdi-hook" ]; then
	echo "nvidia-cdi-hook $version ($link, $arch) up to date in $bin"
	exit 0
fi

ldflags="-s -w -X $module/internal/info.version=${version#v}"
tags=()
if [ "$link" = static ]; then
	[ -f "$($cc -print-file-name=libc.a)" ] || { echo "a static build needs libc.a (apt-get install libc6-dev, or libc6-dev-arm64-cross)" >&2; exit 1; }
	ldflags+=" -linkmode external -extldflags -static"
	# Go's own user and DNS lookups, not glibc's NSS (which static glibc
	# cannot load).
	tags=(-tags "osusergo,netgo")
fi

mkdir -p "$bin"
echo "building nvidia-cdi-hook $version ($link, $arch) into $bin"
start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Outside any module (the project's go.sum lacks the modules its ldconfig
# package needs), so `go install pkg@version` uses the release's own go.mod.
# The output is kept for a failure only: go-nvml's header and the static
# link (dlopen in a static binary) warn on every build.
# go install refuses GOBIN for a cross build, so go build in the module's
# own directory in the module cache (go mod download fetches it).
if ! (cd "$tmp" && GOWORK=off GOFLAGS=-mod=mod go mod init hookbuild >/dev/null 2>&1 &&
	dir=$(GOWORK=off GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') &&
	cd "$dir" && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=1 GOARCH="$arch" CC="$cc" \
	CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" \
	go build -trimpath "${tags[@]}" -ldflags "$ldflags" -o "$tmp/nvidia-cdi-hook" ./cmd/nvidia-cdi-hook) >"$tmp/build.log" 2>&1; then
	cat "$tmp/build.log" >&2
	exit 1
fi

# Checks: the commands our CDI specs use are there, and a static build
# really has no loader (no ELF interpreter).
help=$("${run[@]}" "$tmp/nvidia-cdi-hook" --help)
for cmd in update-ldcache create-symlinks; do
	grep -q "^ *$cmd " <<<"$help" || { echo "nvidia-cdi-hook $version has no $cmd command" >&2; exit 1; }
done
if [ "$link" = static ] && readelf -l "$tmp/nvidia-cdi-hook" | grep -q INTERP; then
	echo "nvidia-cdi-hook is not statically linked" >&2
	exit 1
fi
mv "$tmp/nvidia-cdi-hook" "$bin/nvidia-cdi-hook"
echo "$want" >"$stamp"
echo "built in $(($(date +%s) - start))s"
