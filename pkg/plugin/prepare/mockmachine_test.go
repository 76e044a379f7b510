package prepare

import (
	"slices"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"k8s.io/klog/v2/ktesting"
)

// reopenMachine plays the plugin process's death and a new one's start:
// the old backend is abandoned (never shut down) and a new one opened on
// the same mock state directory, with the devices it publishes.
func (e *testEnv) reopenMachine(t *testing.T, cfg *configapi.NodeConfig) {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + e.machine, MockSeed: testNode, MockStateDir: e.mockStateDir})
	if err != nil {
		t.Fatal(err)
	}
	e.lib = lib
	if e.sharing.NVML != nil {
		e.sharing.NVML = lib
	}
	e.devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, cfg).Devices
}

// Issue 11: a dynamic MIG device made by one plugin process is there, the
// same (UUID, IDs, placement), for the next process on the same node; the
// restarted plugin keeps it for its claim, and its unprepare destroys it
// on the machine, not only in its own memory.
func TestPersistentMockMachineOutlivesPlugin(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", dynamicAll(), t.TempDir())
	claim := newClaim("m").device("mig", e.partitionAt(t, 2, "2g.20gb", 2).Name()).build()
	if _, err := e.state.Prepare(e.ctx, claim); err != nil {
		t.Fatal(err)
	}
	made := e.migDevices(t, 2)
	if len(made) != 1 || made[0].UUID != e.record(t, "m").Devices[0].CreatedMIG.UUID {
		t.Fatalf("prepared %+v, recorded %+v", made, e.record(t, "m").Devices[0].CreatedMIG)
	}

	e.reopenMachine(t, dynamicAll())
	if found := e.migDevices(t, 2); !slices.Equal(found, made) {
		t.Fatalf("the next process finds %+v, want %+v", found, made)
	}
	s := restartWith(t, e, claim)
	if found := e.migDevices(t, 2); !slices.Equal(found, made) {
		t.Fatalf("after the restarted plugin's restore: %+v, want %+v", found, made)
	}
	if err := s.Unprepare(e.ctx, "m"); err != nil {
		t.Fatal(err)
	}
	e.reopenMachine(t, dynamicAll())
	if left := e.migDevices(t, 2); len(left) != 0 {
		t.Errorf("MIG devices left on the machine after unprepare: %+v", left)
	}
}

// Issue 11: a simulated reboot of the persistent machine (MIG devices gone,
// new boot ID) is what the plugin's reboot handling sees at its next start:
// it makes the claim's MIG device again, at its recorded placement.
func TestPersistentMockMachineReboot(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", dynamicAll(), t.TempDir())
	part := e.partitionAt(t, 2, "2g.20gb", 2)
	claim := newClaim("m").device("mig", part.Name()).build()
	if _, err := e.state.Prepare(e.ctx, claim); err != nil {
		t.Fatal(err)
	}
	bootID, err := nvmock.Reboot(e.mockStateDir, e.bootID)
	if err != nil {
		t.Fatal(err)
	}
	e.reopenMachine(t, dynamicAll())
	if e.lib.GPUs()[2].MigEnabled || len(e.migDevices(t, 2)) != 0 {
		t.Fatalf("after the reboot: MIG mode %v, devices %+v; want off, none", e.lib.GPUs()[2].MigEnabled, e.migDevices(t, 2))
	}
	restartWith(t, e, claim)
	now := e.migDevices(t, 2)
	if len(now) != 1 || now[0].Profile != "2g.20gb" || now[0].Placement != part.Partition().Placement {
		t.Fatalf("after the restart: %+v, want one 2g.20gb at %+v", now, part.Partition().Placement)
	}
	rec := e.record(t, "m")
	if rec.BootID != bootID || rec.Devices[0].CreatedMIG == nil || rec.Devices[0].CreatedMIG.UUID != now[0].UUID {
		t.Errorf("record after the reboot: boot %q (want %q), MIG %+v (want %s)", rec.BootID, bootID, rec.Devices[0].CreatedMIG, now[0].UUID)
	}
}
