#!/usr/bin/env bash
# Runs the e2e suite RUNS times (as `make e2e` runs it), each run's
# `go test -json` stream kept in $OUT/run-N.json, then prints each test's
# pass rate (hack/flakereport). LOAD=N keeps N busy loops running during the
# runs, a machine that does something else too. RUN= narrows the tests
# (go test -run), COUNT= repeats each test inside a run (go test -count).
# Every run is made even when one fails: the table is the point.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-5}
load=${LOAD:-0}
out=${OUT:-_output/e2e-repeat/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"

hogs=()
stop_hogs() { [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}" 2>/dev/null; }
trap stop_hogs EXIT
for _ in $(seq 1 "$load"); do
	bash -c 'while :; do :; done' &
	hogs+=($!)
done

args=(-p 1 -count="${COUNT:-1}" -timeout "${TIMEOUT:-45m}" -json)
[ -n "${RUN:-}" ] && args+=(-run "$RUN")
echo "e2e-repeat: $runs runs, $load busy loops, results in $out" | tee "$out/summary.txt"
for i in $(seq 1 "$runs"); do
	start=$(date +%s)
	E2E_REQUIRED=1 go test "${args[@]}" ./test/e2e/... >"$out/run-$i.json" 2>"$out/run-$i.stderr"
	rc=$?
	echo "run $i: exit $rc in $(( $(date +%s) - start ))s, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/summary.txt"
done
go run ./hack/flakereport "$out"/run-*.json | tee -a "$out/summary.txt"
