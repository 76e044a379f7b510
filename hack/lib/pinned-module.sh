# Sourced by the build scripts of tools the tests run (Kueue, kwok) that
# are built from the Go module proxy at a pinned version.
#
# `go install MODULE/cmd/X@VERSION` does not work here: it asks the proxy
# for the module's version list (for deprecations), which the proxy
# refuses. So the one pinned module is downloaded and built in a copy of
# itself, with its own go.mod and go.sum, exactly as its release is.

# pinned_build MODULE VERSION PKG OUT builds ./PKG of MODULE@VERSION into
# the binary OUT and sets PINNED_SRC to the module's (read-only) source, for
# the caller to copy manifests from. It uses a temporary directory of its
# own, removed on exit.
pinned_build() {
	local module=$1 version=$2 pkg=$3 out=$4
	pinned_tmp=$(mktemp -d)
	trap 'chmod -R u+w "$pinned_tmp"; rm -rf "$pinned_tmp"' EXIT
	# Outside any module, so the repository's go.mod is not touched.
	PINNED_SRC=$(cd "$pinned_tmp" && GOFLAGS=-mod=mod go mod download -json "$module@$version" |
		sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
	[ -d "$PINNED_SRC" ] || { echo "downloading $module@$version failed" >&2; return 1; }
	cp -r "$PINNED_SRC" "$pinned_tmp/src"
	chmod -R u+w "$pinned_tmp/src"
	(cd "$pinned_tmp/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out" "./$pkg")
}
