package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// outcome is what a user gets from one case of the version matrix, as
// docs/reference/version-matrix.md states it.
type outcome string

const (
	outcomeRuns outcome = "runs"
	// outcomeWaits: the pod stays Pending with the scheduler's own reason
	// (cannot allocate all claims) and the node says which gate is off
	// (ClusterFeatureMissing, checked by TestSlicesOnEachAPIServer).
	outcomeWaits outcome = "waits"
	// outcomeWaitsAllocator: the pool offers it, but the version's
	// allocator refuses it (storedShape.keepsRejectedCounters).
	outcomeWaitsAllocator outcome = "may wait: allocator bug, fixed in 1.36"
	outcomeFallsBack      outcome = "falls back to a whole GPU"
	outcomeStaysPending   outcome = "stays pending"
)

// queuedCase is the matrix column of checkQueuedBehindWholeGPU.
const queuedCase = "queued-through-restart"

// matrixOutEnv names the file TestUserCasesOnEachControlPlane writes the
// matrix to when every case ran and passed (make test-versions: the docs).
const matrixOutEnv = "E2E_MATRIX_OUT"

// offered: the stored pool has what the case needs.
func (u userCase) offered(shape storedShape) bool {
	switch u.needs {
	case "shares":
		return shape.shares
	case "dynamicMIG":
		return shape.dynamicMIG
	}
	return true
}

// expected is the outcome the matrix promises for the case on a pool of
// that shape.
func (u userCase) expected(shape storedShape) outcome {
	switch {
	case !u.offered(shape):
		return outcomeWaits
	case u.name == "first-available" && !shape.dynamicMIG:
		return outcomeFallsBack
	case u.name == "four-migs" && shape.keepsRejectedCounters:
		return outcomeWaitsAllocator
	}
	return outcomeRuns
}

// matrixColumns: the user cases, then the queued check.
func matrixColumns() []string {
	var cols []string
	for _, u := range userCases {
		cols = append(cols, u.name)
	}
	return append(cols, queuedCase)
}

// versionMatrix collects each case's outcomes and time.
type versionMatrix struct {
	mu     sync.Mutex
	start  time.Time
	rows   []string
	failed bool
}

func newVersionMatrix() *versionMatrix { return &versionMatrix{start: time.Now()} }

// add records one case's row; a case that failed, was skipped or left a
// cell empty keeps the whole matrix from being written.
func (m *versionMatrix) add(t *testing.T, c apiServerCase, cells map[string]outcome, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	row := []string{matrixVersion(t, c), matrixGates(c)}
	for _, col := range matrixColumns() {
		o, ok := cells[col]
		if !ok {
			m.failed = true
		}
		row = append(row, string(o))
	}
	if t.Failed() || t.Skipped() {
		m.failed = true
	}
	row = append(row, took.Round(time.Second).String())
	m.rows = append(m.rows, "| "+strings.Join(row, " | ")+" |")
}

// write puts the matrix where E2E_MATRIX_OUT says, only when every case of
// apiServerCases ran and passed: a partial table never replaces the docs.
func (m *versionMatrix) write(t *testing.T) {
	path := os.Getenv(matrixOutEnv)
	switch {
	case path == "":
		return
	case m.failed || len(m.rows) != len(apiServerCases):
		t.Logf("%s: not written: %d of %d cases ran and passed", path, len(m.rows), len(apiServerCases))
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n| Kubernetes | gates | %s | time |\n|%s\n", matrixPreamble,
		strings.Join(matrixColumns(), " | "), strings.Repeat("---|", len(matrixColumns())+3))
	b.WriteString(strings.Join(m.rows, "\n"))
	fmt.Fprintf(&b, "\n\nAll %d cases: %s on %s (load average at the end: %s).\n", len(m.rows),
		time.Since(m.start).Round(time.Second), time.Now().UTC().Format("2006-01-02"), loadAverage())
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatalf("writing the version matrix: %v", err)
	}
	t.Logf("version matrix written to %s", path)
}

const matrixPreamble = `# The version matrix: what a user gets on each Kubernetes version

Written by ` + "`make test-versions`" + ` (TestUserCasesOnEachControlPlane, test/e2e/versions_scheduling_test.go)
when every case passed; do not edit by hand. TestVersionMatrixDocMatches fails when this table and the
cases' expectations disagree. Each row is one control plane of that version (its own kube-apiserver,
kube-scheduler and kube-controller-manager) with the demo node's plugin (GPUs 0-3 whole, 4 as time-slice
replicas, 5 shared, 6-7 dynamic MIG); "gates" is the defaults or the gates and ` + "`--runtime-config`" + `
[install.md](../install.md#1-kubernetes-version-and-feature-gates) tells that version's admins to set.

- **runs**: the pod runs on the device it asked for, prepared by the plugin.
- **waits**: the pod stays Pending with the scheduler's reason ` + "`cannot allocate all claims`" + `; the
  node's Warning event ` + "`ClusterFeatureMissing`" + ` and the metric ` + "`gpuaas_dra_plugin_cluster_feature_missing`" + `
  name the gate that is off. Never another device.
- **may wait: allocator bug, fixed in 1.36**: the pool offers it, but the scheduler's allocator of 1.34 and 1.35
  keeps the counters of a device a claim constraint rejected, so a claim of several MIG devices of one GPU
  (` + "`matchAttribute`" + `) is refused once the first GPU it tried could not hold them all, and runs
  where the first GPU it tries is the free one (both seen on 1.34.4;
  [install.md](../install.md#what-each-kubernetes-version-keeps) has the workaround).
- **falls back to a whole GPU**: ` + "`firstAvailable`" + ` asked for a MIG device first; with none offered it gets GPU 1.
- **queued-through-restart**: a dynamic-MIG pod queued behind a pod holding GPU 7 whole **stays pending**
  through a plugin restart, and no GPU is ever allocated whole and in part.

Cases: whole (GPU 0), two-gpus (GPUs 2 and 3 in one request), replica (a time-slice replica of GPU 4),
share (10Gi of GPU 5), mig (a dynamic 1g.10gb of GPU 6), first-available, four-migs (1g.10gb, 1g.10gb+me,
2g.20gb and 3g.40gb on GPU 7 in one claim: demo/specs/mig/four-profiles-one-gpu).`

// loadAverage is /proc/loadavg's first three fields, or "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func matrixVersion(t *testing.T, c apiServerCase) string {
	if c.version == "" {
		return ownKubernetesVersion(t)
	}
	return strings.TrimPrefix(c.version, "v")
}

func matrixGates(c apiServerCase) string {
	if c.gates == docGates {
		return "documented"
	}
	return "defaults"
}

// TestVersionMatrixDocMatches: docs/reference/version-matrix.md, written by
// the last make test-versions, has one row per case of apiServerCases and
// states for each user case the outcome the case expects now. Changing an
// expectation without running the matrix again fails here, without
// building any control plane (issue 35).
func TestVersionMatrixDocMatches(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "reference", "version-matrix.md"))
	if err != nil {
		t.Fatalf("the version matrix is missing (make test-versions writes it): %v", err)
	}
	rows := map[string][]string{}
	cols := matrixColumns()
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) == len(cols)+3 && cells[0] != "Kubernetes" {
			rows[cells[0]+" | "+cells[1]] = cells[2 : len(cells)-1]
		}
	}
	for _, c := range apiServerCases {
		key := matrixVersion(t, c) + " | " + matrixGates(c)
		got, ok := rows[key]
		if !ok {
			t.Errorf("docs/reference/version-matrix.md has no row for %s (case %s)", key, c.name)
			continue
		}
		delete(rows, key)
		for i, u := range userCases {
			if want := u.expected(c.want); got[i] != string(want) {
				t.Errorf("%s, %s: the doc says %q, the case expects %q", key, u.name, got[i], want)
			}
		}
		if got[len(cols)-1] != string(outcomeStaysPending) {
			t.Errorf("%s, %s: the doc says %q", key, queuedCase, got[len(cols)-1])
		}
	}
	for key := range rows {
		t.Errorf("docs/reference/version-matrix.md has a row for %s, which no case runs", key)
	}
}
