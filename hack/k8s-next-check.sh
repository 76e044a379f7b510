#!/usr/bin/env bash
# Checks whether the Go module proxy serves everything the next Kubernetes
# minor's control plane and kubelet need (issue 57), and builds them when it
# does. Usage:
#   hack/k8s-next-check.sh [VERSION]     (default: v1.38.0, else v1.38.0-beta.0)
# It reads the release's go.mod from the proxy (k8s.io/kubernetes pins its
# staging modules through replace directives, so a consumer requires each at
# v0.MINOR.PATCH), asks the proxy for every module that go.mod requires, and
# prints each one refused. When none is, it builds kube-apiserver,
# kube-scheduler, kube-controller-manager and kubelet with the Go toolchain
# the release's go.mod asks for (fetched by the go command as
# golang.org/toolchain) into _output/k8s/<version>/, and only those: the
# project's own go.mod is not touched. When every module refused is one only
# the kubelet needs (kubelet_only below), it builds the control plane alone
# and names what keeps the kubelet out: a 1.37 kubelet under a 1.38 control
# plane is a supported skew, and the version tests (test/e2e/versions_test.go)
# run no kubelet. A component whose stamp shows it was built from the same
# module and script is not built again. Exit status: 0 all four built (or up
# to date); 4 the control plane built, the kubelet not (only modules of
# kubelet_only refused); 3 something the control plane needs is refused (the
# report says what); anything else an error.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# The toolchain the 1.38 modules need (go 1.27.0 in their go.mod); the
# proxy serves it (docs/development.md).
toolchain=${K8S_NEXT_TOOLCHAIN:-go1.27.4}
export GOTOOLCHAIN=$toolchain GOFLAGS=-mod=mod
# Modules that only the kubelet (and kube-proxy, not built here) import: their
# refusal keeps the kubelet out, not the control plane.
# sigs.k8s.io/iptables-wrappers: imported by pkg/kubelet
# (kubelet_network_linux.go) and pkg/proxy only (as of v1.38.0-beta.0).
kubelet_only=(sigs.k8s.io/iptables-wrappers)

served() { # module@version -> prints the proxy's refusal (what it read, its status), if any
	go mod download -json "$1" 2>/dev/null | sed -n 's/^\t"Error": "\(.*\)",\{0,1\}$/\1/p' | head -1 |
		sed -n 's#.*reading https://[^/]*/[^ ]*/@v/\([^:]*\): \([0-9][0-9]* [A-Za-z ]*\).*#\1: \2#p; t; s/.*/&/p' | cut -c1-120
}

version=${1:-}
if [ -z "$version" ]; then
	version=v1.38.0
	if [ -n "$(served k8s.io/kubernetes@$version)" ]; then
		echo "k8s.io/kubernetes@$version: not served yet; checking v1.38.0-beta.0"
		version=v1.38.0-beta.0
	fi
fi
if why=$(served "k8s.io/kubernetes@$version") && [ -n "$why" ]; then
	echo "k8s.io/kubernetes@$version: refused: $why"
	exit 3
fi
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
staging_version=v0.${version#v1.}
goversion=$(awk '$1 == "go" {print $2; exit}' "$gomod")
echo "k8s.io/kubernetes@$version: served (go $goversion; staging modules at $staging_version; toolchain $toolchain)"

# Every module the release's go.mod requires: staging modules (replaced by
# ./staging there) at the staging version, the rest at the version pinned.
staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod" | sort -u)
mods=$(awk '/^require \(/{r=1; next} r && /^\)/{r=0} r && $1 !~ /^\/\// {print $1 "@" $2} /^require [^(]/{print $2 "@" $3}' "$gomod" |
	while read -r m; do
		path=${m%@*}
		if grep -qx "$path" <<<"$staging"; then echo "$path@$staging_version"; else echo "$m"; fi
	done | sort -u)
for s in $staging; do grep -q "^$s@" <<<"$mods" || mods+=$'\n'"$s@$staging_version"; done

refused=$(mktemp)
trap 'rm -f "$refused"' EXIT
export -f served
# The staging examples (k8s.io/sample-*) are in the release's go.mod but no
# component imports them: their refusal blocks nothing.
needed=$(sort -u <<<"$mods" | grep -v '^k8s.io/sample-')
grep '^k8s.io/sample-' <<<"$mods" | sed 's/^/  not needed by the components (a staging example): /' || true
xargs -P 8 -I{} bash -c 'why=$(served "$1"); [ -z "$why" ] || echo "  $1: $why"' _ {} <<<"$needed" >"$refused"
total=$(grep -c . <<<"$needed")
components=(kube-apiserver kube-scheduler kube-controller-manager kubelet)
kubelet_blocked=
if [ -s "$refused" ]; then
	echo "refused by the proxy today ($(wc -l <"$refused") of $total modules the release requires):"
	sort "$refused"
	# Each refused module's path; those not in kubelet_only block the control plane.
	paths=$(awk '{sub(/@.*/, "", $1); print $1}' "$refused" | sort -u)
	blocking=$(grep -vxF -f <(printf '%s\n' "${kubelet_only[@]}") <<<"$paths" || true)
	if [ -n "$blocking" ]; then
		echo "so the $version control plane and kubelet cannot be built here yet."
		exit 3
	fi
	kubelet_blocked=$(awk '{sub(/:$/, "", $1); print $1}' "$refused" | sort -u | paste -sd' ')
	echo "only the kubelet needs those: building the $version control plane without it ($kubelet_blocked refused)"
	components=(kube-apiserver kube-scheduler kube-controller-manager)
else
	echo "all $total modules the release requires are served"
fi

out="$root/_output/k8s/$version"
mod="$root/_output/k8s-next/$version"
mkdir -p "$out" "$mod"
cat >"$mod/go.mod" <<EOF
module gpuaas.local/k8s-next

go $goversion

require k8s.io/kubernetes $version
EOF
{
	echo "require ("
	# Not the staging examples: no component imports them, and a required
	# module's go.mod must be served (k8s.io/sample-cli-plugin's is not).
	for s in $staging; do [[ $s == k8s.io/sample-* ]] || echo "	$s $staging_version"; done
	echo ")"
} >>"$mod/go.mod"
# Only the components built: go mod tidy fetches the source of every module
# a listed command imports, so the kubelet's import would need its refused zip.
{
	printf '//go:build tools\n\npackage tools\n\nimport (\n'
	for c in "${components[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
	printf ')\n'
} >"$mod/tools.go"
rm -f "$mod/go.sum"
cd "$mod"
start=$(date +%s)
go mod tidy
echo "go mod tidy in $(( $(date +%s) - start ))s"
want=$(cat go.mod go.sum tools.go "$root/hack/k8s-next-check.sh" | sha256sum | cut -d' ' -f1)
m=$(echo "$version" | cut -d. -f2)
ld="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$m"
for c in "${components[@]}"; do
	stamp="$out/.$c.stamp"
	if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$out/$c" ]; then
		echo "$c $version up to date in $out"
		continue
	fi
	echo "building $c $version into $out"
	start=$(date +%s)
	go build -trimpath -ldflags "$ld" -o "$out/$c" "k8s.io/kubernetes/cmd/$c"
	echo "$want" >"$stamp"
	echo "built $c in $(( $(date +%s) - start ))s"
done
if [ -n "$kubelet_blocked" ]; then
	echo "kubelet $version not built: the proxy refuses $kubelet_blocked (exit 4)"
	exit 4
fi
