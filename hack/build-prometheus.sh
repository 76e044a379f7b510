#!/usr/bin/env bash
# Puts Prometheus's server and promtool into _output/bin, from Debian
# bookworm's `prometheus` package (unpacked with dpkg -x, never installed),
# and the Prometheus Operator's CRDs the chart's monitoring objects are
# checked against (ServiceMonitor, PodMonitor, PrometheusRule) into
# _output/prometheus-operator/crds, from the operator's Go module at a pinned
# version (the Go module proxy; the operator itself is not built).
# The monitoring tests run `promtool check rules` and `promtool test rules`
# on the chart's rules, and the e2e suite runs the server against the real
# node. Debian's Go build links only against glibc (ldd: libc.so.6), which a
# bookworm machine has, so the binaries run from _output/bin without the
# rest of the package (its web assets are only for the UI, which the tests
# do not use). The build is skipped when a stamp file shows the binaries
# came from this same version and script.
set -euo pipefail

# Pinned: bookworm's stable version (the point release carries Debian's
# security fixes). A new one is a deliberate change here, and the rules'
# promtool tests are then rerun against it.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-2.42.0+ds-5+deb12u1}"
# The operator whose CRDs kube-prometheus-stack 70.x ships.
OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.81.0}"

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/hack/lib/debs.sh"
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
crds="$root/_output/prometheus-operator/crds"
stamp="$bin/.prometheus.stamp"
want=$(printf '%s\n' "$PROMETHEUS_VERSION" "$OPERATOR_VERSION" | cat - "$0" "$root/hack/lib/debs.sh" | sha256sum | cut -d' ' -f1)

if debs_stamp_current "$stamp" "$want" "$bin/promtool" && [ -x "$bin/prometheus" ] && [ -d "$crds" ]; then
	echo "prometheus $PROMETHEUS_VERSION and prometheus-operator $OPERATOR_VERSION CRDs up to date"
	exit 0
fi

echo "fetching prometheus $PROMETHEUS_VERSION (Debian bookworm) into $bin"
start=$(date +%s)
mkdir -p "$bin"
tmp=$(mktemp -d "$bin/.prometheus.XXXXXX")
# Outside the repository, so that `go mod download` runs outside its module.
modtmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$modtmp"' EXIT
# Only the package itself: its dependencies are the service's user, logrotate
# and the like, none of which the binaries need.
debs_fetch "$tmp/root" "prometheus=$PROMETHEUS_VERSION"
for b in prometheus promtool; do
	[ -f "$tmp/root/usr/bin/$b" ] || { echo "the package has no usr/bin/$b" >&2; exit 1; }
	install -m 0755 "$tmp/root/usr/bin/$b" "$tmp/$b"
done
# A binary that cannot run here (a dynamic one missing its libraries) fails
# now, not in the middle of a test.
"$tmp/promtool" --version >/dev/null
"$tmp/prometheus" --version >/dev/null
mv -f "$tmp/promtool" "$tmp/prometheus" "$bin/"

# The CRDs: `go mod download` outside any module, so the repository's
# go.mod is not touched (hack/lib/pinned-module.sh says why not go install).
src=$(cd "$modtmp" && GOFLAGS=-mod=mod go mod download -json "github.com/prometheus-operator/prometheus-operator@$OPERATOR_VERSION" |
	sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "downloading prometheus-operator $OPERATOR_VERSION failed" >&2; exit 1; }
rm -rf "$crds"
mkdir -p "$crds"
for kind in servicemonitors podmonitors prometheusrules; do
	cp "$src/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$crds/"
done
chmod u+w "$crds"/*.yaml
echo "$OPERATOR_VERSION" >"$crds/VERSION"
echo "$want" >"$stamp"
"$bin/promtool" --version | head -n1
echo "fetched in $(($(date +%s) - start))s"
