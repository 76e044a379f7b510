#!/usr/bin/env bash
# Runs distribution's registry (make release-tools) in the foreground on
# ADDR (127.0.0.1:5000), plain HTTP, storage in DIR: the local registry the
# release is pushed to and installed from (make registry).
set -euo pipefail
addr=$1 dir=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir/storage"
cat >"$dir/config.yml" <<CFG
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
http:
  addr: $addr
CFG
echo "registry on http://$addr (storage $dir/storage)"
# No OpenTelemetry collector: do not try to export traces to localhost:4318.
OTEL_TRACES_EXPORTER=none exec "${KUBE_BIN_DIR:-$root/_output/bin}/registry" serve "$dir/config.yml"
