package prepare

import (
	"slices"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// Issue 11: a dynamic MIG device made by one plugin process is there, the
// same (UUID, IDs, placement), for the next process on the same node; the
// restarted plugin keeps it for its claim, and its unprepare destroys it
// on the machine, not only in its own memory.
func TestPersistentMockMachineOutlivesPlugin(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", preparetest.DynamicAll(), t.TempDir())
	claim := preparetest.NewClaim("m").Device("mig", e.PartitionAt(t, 2, "2g.20gb", 2).Name()).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	made := e.MIGDevices(t, 2)
	if len(made) != 1 || made[0].UUID != e.record(t, "m").Devices[0].CreatedMIG.UUID {
		t.Fatalf("prepared %+v, recorded %+v", made, e.record(t, "m").Devices[0].CreatedMIG)
	}

	e.ReopenMachine(t, preparetest.DynamicAll())
	if found := e.MIGDevices(t, 2); !slices.Equal(found, made) {
		t.Fatalf("the next process finds %+v, want %+v", found, made)
	}
	s := restartWith(t, e, claim)
	if found := e.MIGDevices(t, 2); !slices.Equal(found, made) {
		t.Fatalf("after the restarted plugin's restore: %+v, want %+v", found, made)
	}
	if err := s.Unprepare(e.Ctx, "m"); err != nil {
		t.Fatal(err)
	}
	e.ReopenMachine(t, preparetest.DynamicAll())
	if left := e.MIGDevices(t, 2); len(left) != 0 {
		t.Errorf("MIG devices left on the machine after unprepare: %+v", left)
	}
}

// Issue 11: a simulated reboot of the persistent machine (MIG devices gone,
// new boot ID) is what the plugin's reboot handling sees at its next start:
// it makes the claim's MIG device again, at its recorded placement.
func TestPersistentMockMachineReboot(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", preparetest.DynamicAll(), t.TempDir())
	part := e.PartitionAt(t, 2, "2g.20gb", 2)
	claim := preparetest.NewClaim("m").Device("mig", part.Name()).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	bootID, err := nvmock.Reboot(e.MockStateDir, e.BootID)
	if err != nil {
		t.Fatal(err)
	}
	e.ReopenMachine(t, preparetest.DynamicAll())
	if e.Lib.GPUs()[2].MigEnabled || len(e.MIGDevices(t, 2)) != 0 {
		t.Fatalf("after the reboot: MIG mode %v, devices %+v; want off, none", e.Lib.GPUs()[2].MigEnabled, e.MIGDevices(t, 2))
	}
	restartWith(t, e, claim)
	now := e.MIGDevices(t, 2)
	if len(now) != 1 || now[0].Profile != "2g.20gb" || now[0].Placement != part.Partition().Placement {
		t.Fatalf("after the restart: %+v, want one 2g.20gb at %+v", now, part.Partition().Placement)
	}
	rec := e.record(t, "m")
	if rec.BootID != bootID || rec.Devices[0].CreatedMIG == nil || rec.Devices[0].CreatedMIG.UUID != now[0].UUID {
		t.Errorf("record after the reboot: boot %q (want %q), MIG %+v (want %s)", rec.BootID, bootID, rec.Devices[0].CreatedMIG, now[0].UUID)
	}
}
