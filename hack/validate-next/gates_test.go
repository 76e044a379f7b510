package validatenext

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
)

// TestInstallDocMatches138Gates: docs/install.md's 1.38 column says of
// each gate what 1.38's own gate table does (the e2e framework passes the
// column's "enable" gates to every component): a gate marked "none" is not
// one 1.38 knows (a component given it does not start: DynamicResourceAllocation),
// every other is, "on" where it defaults on, "locked" where it is locked
// to its default, "GA" or "beta" as its stage.
func TestInstallDocMatches138Gates(t *testing.T) {
	rows := installColumn(t, "1.38")
	if len(rows) < 5 {
		t.Fatalf("docs/install.md's 1.38 column has %d gates: %v", len(rows), rows)
	}
	known := utilfeature.DefaultMutableFeatureGate.GetAll()
	for gate, cell := range rows {
		spec, ok := known[featuregate.Feature(gate)]
		if strings.HasPrefix(cell, "none") {
			if ok {
				t.Errorf("%s: docs/install.md says 1.38 has no such gate (%q); 1.38 has it: %+v", gate, cell, spec)
			}
			continue
		}
		if !ok {
			t.Errorf("%s: docs/install.md says %q; 1.38 has no such gate: a component given it does not start", gate, cell)
			continue
		}
		checks := []struct {
			doc, actual bool
			what        string
		}{
			{strings.HasPrefix(cell, "on"), spec.Default, "on by default"},
			{strings.Contains(cell, "locked"), spec.LockToDefault, "locked to its default"},
			{strings.Contains(cell, "GA"), spec.PreRelease == featuregate.GA && !spec.LockToDefault, "GA (not locked)"},
			{strings.Contains(cell, "beta"), spec.PreRelease == featuregate.Beta, "beta"},
		}
		for _, c := range checks {
			if c.doc != c.actual {
				t.Errorf("%s: docs/install.md says %q; in 1.38 it is %s: %v (%+v)", gate, cell, c.what, c.actual, spec)
			}
		}
	}
}

// installColumn reads docs/install.md's gate table: each gate's cell in
// the column of minor.
func installColumn(t *testing.T, minor string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	col := -1
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if cells[0] == "used for" {
			col = slices.Index(cells, minor)
			continue
		}
		// A gate's row: "`Name` (KEP)".
		name := strings.Split(cells[1], "`")
		if col < 0 || col >= len(cells) || len(name) != 3 || strings.HasPrefix(name[1], "-") || !strings.HasPrefix(strings.TrimSpace(name[2]), "(") {
			continue
		}
		out[name[1]] = cells[col]
	}
	if col < 0 {
		t.Fatalf("docs/install.md has no gate table column %s", minor)
	}
	return out
}
