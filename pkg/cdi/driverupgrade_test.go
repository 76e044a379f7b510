package cdi

import (
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
)

// upgradedVersion is the driver a test upgrades to.
const upgradedVersion = "560.35.03"

// mountsOf are a spec's mounts, container path to host path.
func mountsOf(t *testing.T, cdiRoot, uid string) map[string]string {
	t.Helper()
	mounts := map[string]string{}
	for _, m := range readBack(t, cdiRoot, uid).ContainerEdits.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	return mounts
}

// After a driver upgrade, the common edits computed at start named the old
// version's libraries, which the upgrade removed: every container started
// from then on failed to load libcuda. Refresh, with NVML reporting the new
// version, makes the specs written from then on name the new files, and
// leaves the specs already written (their containers still run on the old
// driver) as they were.
func TestRefreshAfterDriverUpgradeNamesTheNewLibraries(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	h, cdiRoot := newHandler(t, root.Root)
	write(t, h, "before", twoGPUs())
	oldLib := root.LibPath("libnvidia-ml.so")

	root.Upgrade(t, upgradedVersion)
	upgraded := dgxh100.New()
	upgraded.DriverVersion = upgradedVersion
	version, err := h.Refresh(upgraded)
	if err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if version != upgradedVersion || h.DriverVersion() != upgradedVersion {
		t.Errorf("Refresh = %q, DriverVersion = %q, want %q", version, h.DriverVersion(), upgradedVersion)
	}
	write(t, h, "after", twoGPUs())

	after := mountsOf(t, cdiRoot, "after")
	for _, lib := range []string{"libnvidia-ml.so", "libcuda.so"} {
		p := root.LibPath(lib)
		if after[p] != root.HostPath(p) {
			t.Errorf("spec after the upgrade: mount of %s = %q, want %q; mounts %v", p, after[p], root.HostPath(p), after)
		}
	}
	if _, ok := after[oldLib]; ok {
		t.Errorf("spec after the upgrade still mounts the old %s", oldLib)
	}
	if before := mountsOf(t, cdiRoot, "before"); before[oldLib] != filepath.Join(root.Root, oldLib) {
		t.Errorf("spec written before the upgrade changed: mount of %s = %q", oldLib, before[oldLib])
	}
}

// A refresh that fails keeps the edits of the driver the specs named,
// rather than specs without driver files.
func TestFailedRefreshKeepsTheEdits(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	h, cdiRoot := newHandler(t, root.Root)
	// A driver is found but there is no hook to give containers: refused.
	h.opts.CDIHookPath = ""
	if _, err := h.Refresh(dgxh100.New()); err == nil {
		t.Fatal("Refresh without a hook path succeeded")
	}
	if h.DriverVersion() != mockDriverVersion {
		t.Errorf("DriverVersion after a failed refresh = %q, want %q", h.DriverVersion(), mockDriverVersion)
	}
	write(t, h, claimUID, twoGPUs())
	if p := root.LibPath("libnvidia-ml.so"); mountsOf(t, cdiRoot, claimUID)[p] == "" {
		t.Errorf("spec after a failed refresh lost the driver's %s", p)
	}
}
