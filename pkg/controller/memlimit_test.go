package controller

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMemoryLimitFromTheContainer (issue 52): without GOMEMLIMIT the Go
// runtime collects garbage by GOGC alone, and a heap that doubles past the
// container's limit is killed by the kernel before the collector runs; the
// controller aims the collector at 90% of the limit, read from the chart's
// downward-API variable, else from the cgroup.
func TestMemoryLimitFromTheContainer(t *testing.T) {
	cgroup := filepath.Join(t.TempDir(), "memory.max")
	write := func(s string) {
		if err := os.WriteFile(cgroup, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const mi = 1 << 20
	for _, c := range []struct {
		name      string
		env       map[string]string
		cgroup    string
		want      int64
		wantFound bool
	}{
		{"the chart's variable", map[string]string{MemoryLimitEnv: "268435456"}, "max\n", 256 * mi * 9 / 10, true},
		{"the cgroup", nil, "536870912\n", 512 * mi * 9 / 10, true},
		{"no limit", nil, "max\n", 0, false},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "100MiB", MemoryLimitEnv: "268435456"}, "536870912\n", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", "")
			t.Setenv(MemoryLimitEnv, "")
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			write(c.cgroup)
			got, found, err := memoryTarget(cgroup)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want || found != c.wantFound {
				t.Errorf("target %d (found %v), want %d (%v)", got, found, c.want, c.wantFound)
			}
		})
	}
}
