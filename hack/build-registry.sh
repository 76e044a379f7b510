#!/usr/bin/env bash
# Builds the release tools from the Go module proxy into _output/bin:
# distribution's OCI registry (the "registry" the release and its e2e test
# push to and pull from on 127.0.0.1) and go-containerregistry's crane (the
# client that pushes the release's image layout, and mirrors a release:
# docs/install.md). The build is skipped when a stamp file shows the same
# versions and script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KUBE_BIN_DIR:-$root/_output/bin}"
registry_version="${REGISTRY_VERSION:-v3.1.2}"
crane_version="${CRANE_VERSION:-v0.22.1}"
stamp="$bin/.registry.stamp"
want=$(printf '%s %s\n' "$registry_version" "$crane_version" | cat - "$0" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$bin/registry" ] && [ -x "$bin/crane" ]; then
	echo "registry $registry_version and crane $crane_version up to date in $bin"
	exit 0
fi

mkdir -p "$bin"
echo "building registry $registry_version and crane $crane_version into $bin"
start=$(date +%s)
# Module-aware installs of pinned versions, outside this repository's
# go.mod. Neither needs cgo.
(cd / && GOWORK=off CGO_ENABLED=0 GOBIN="$bin" GOFLAGS=-trimpath \
	go install "github.com/distribution/distribution/v3/cmd/registry@$registry_version")
(cd / && GOWORK=off CGO_ENABLED=0 GOBIN="$bin" GOFLAGS=-trimpath \
	go install "github.com/google/go-containerregistry/cmd/crane@$crane_version")
"$bin/registry" --version
"$bin/crane" version
echo "$want" >"$stamp"
echo "built in $(($(date +%s) - start))s"
