package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestInstallTableMatchesTheMatrix: docs/install.md's "What each
// Kubernetes version keeps" has a row for each API server and gate setting
// of the version matrix (apiServerCases), and only for those, and each row
// says what the matrix checks is stored there. A table that drifts from
// the runs fails here, without building any API server (issue 35).
func TestInstallTableMatchesTheMatrix(t *testing.T) {
	rows := installKeepsTable(t)
	own := ownKubernetesVersion(t)
	for _, c := range apiServerCases {
		version := strings.TrimPrefix(c.version, "v")
		if version == "" {
			version = own
		}
		gates := "defaults"
		if c.gates == docGates {
			gates = `"enable" column above`
		}
		key := version + " | " + gates
		got, ok := rows[key]
		if !ok {
			t.Errorf("docs/install.md has no row for %s (case %s)", key, c.name)
			continue
		}
		delete(rows, key)
		want := c.want
		want.extendedResource = false      // not a column of the table
		want.keepsRejectedCounters = false // the scheduler's, not the pool's
		want.kubeletHealth = 0             // the kubelet's
		if got != want {
			t.Errorf("docs/install.md says %s stores %+v; the matrix's case %s checks %+v", key, got, c.name, want)
		}
	}
	for key := range rows {
		t.Errorf("docs/install.md has a row for %s, which no case of the matrix runs", key)
	}
}

// installKeepsTable reads the rows of install.md's "What each Kubernetes
// version keeps" table, by "version | gates".
func installKeepsTable(t *testing.T) map[string]storedShape {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]storedShape{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case len(cells) > 0 && cells[0] == "API server":
			in = true
			continue
		case !in || strings.HasPrefix(cells[0], "---"):
			continue
		case len(cells) != 6:
			in = false
			continue
		}
		out[cells[0]+" | "+cells[1]] = storedShape{
			dynamicMIG:     cells[2] == "offered",
			shares:         cells[3] == "offered",
			countersBeside: strings.HasPrefix(cells[4], "beside"),
			taints:         strings.HasPrefix(cells[5], "published"),
		}
	}
	if len(out) == 0 {
		t.Fatal(`docs/install.md has no "What each Kubernetes version keeps" table`)
	}
	return out
}

// ownKubernetesVersion is the version of the control plane the suite
// builds (hack/k8s-bins pins it).
func ownKubernetesVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "hack", "k8s-bins", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes v(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("hack/k8s-bins/go.mod pins no k8s.io/kubernetes")
	}
	return string(m[1])
}
