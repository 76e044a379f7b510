#!/usr/bin/env bash
# One whole-GPU claim's prepare, followed through the plugin's code (issue
# 34): the files a reader enters from Driver.PrepareResourceClaims, and how
# often they go back to a file already left. See main.go for the counting.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for run in setup run; do
	WALK_SETUP_ONLY=$([ $run = setup ] && echo 1 || true) go test -count=1 -covermode=atomic \
		-coverpkg=./pkg/plugin/... -coverprofile="$out/$run.prof" -run '^TestPrepareOfOneClaimForTheWalk$' ./pkg/plugin/ >/dev/null
done
(cd hack/callwalk && go build -o "$out/callwalk" .)
"$out/callwalk" -dir . -prefix github.com/gpuaas/gpu-dra-driver/pkg/plugin \
	-setup-profile "$out/setup.prof" -run-profile "$out/run.prof" \
	-func '(*github.com/gpuaas/gpu-dra-driver/pkg/plugin.Driver).PrepareResourceClaims' "$@"
