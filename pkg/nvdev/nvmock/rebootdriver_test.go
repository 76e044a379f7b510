package nvmock_test

import (
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// A reboot loads the driver: an unload before it (a driver upgrade cut
// short by the reboot) left every NVML session failing with Driver Not
// Loaded after it.
func TestRebootLoadsAnUnloadedDriver(t *testing.T) {
	dir := t.TempDir()
	open := func() error {
		lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: "node-1", MockStateDir: dir})
		if err == nil {
			_ = lib.Shutdown()
		}
		return err
	}
	if err := open(); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.UnloadDriver(dir); err != nil {
		t.Fatal(err)
	}
	if err := open(); err == nil {
		t.Fatal("NVML opened with the driver unloaded")
	}
	if _, err := nvmock.Reboot(dir, ""); err != nil {
		t.Fatal(err)
	}
	if err := open(); err != nil {
		t.Fatalf("NVML after the reboot: %v", err)
	}
}
