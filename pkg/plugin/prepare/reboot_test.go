package prepare

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// rebootMachine simulates a node reboot: the same GPUs on a fresh mock
// machine (no MIG devices, default settings), a new boot ID and, where the
// CDI root is a tmpfs, no CDI specs. The records survive, as in /var/lib.
// The plugin's start after it is restartWith.
func (e *testEnv) rebootMachine(t *testing.T, cfg *configapi.NodeConfig, tmpfsCDI bool) {
	t.Helper()
	e.OpenMachine(t, cfg, "")
	if err := os.WriteFile(e.BootID, []byte("boot-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tmpfsCDI {
		if err := os.RemoveAll(e.CDIRoot); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *testEnv) record(t *testing.T, uid string) *checkpoint.Claim {
	t.Helper()
	store, err := checkpoint.NewStore(e.CkptDir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Load(uid)
	if err != nil || rec == nil {
		t.Fatalf("record of %s: %v, %v", uid, rec, err)
	}
	return rec
}

func cdiIDs(devs []kubeletplugin.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.CDIDeviceIDs...)
	}
	return out
}

// Item 9: a dynamic MIG claim prepared before a reboot gets its MIG device
// again, of its profile at its placement, and a CDI spec naming it under
// the CDI device IDs the kubelet kept.
func TestRebootRecreatesDynamicMIG(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	part := e.PartitionAt(t, 2, "2g.20gb", 2)
	claim := preparetest.NewClaim("m").Device("mig", part.Name()).Build()
	before, err := e.state.Prepare(e.Ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	e.rebootMachine(t, preparetest.DynamicAll(), false)
	s := restartWith(t, e, claim)
	now := e.MIGDevices(t, 2)
	if len(now) != 1 || now[0].Profile != "2g.20gb" || now[0].Placement != part.Partition().Placement {
		t.Fatalf("MIG devices after the reboot: %+v; want one 2g.20gb at %+v", now, part.Partition().Placement)
	}
	if rec := e.record(t, "m"); rec.State != checkpoint.PrepareCompleted || rec.Devices[0].CreatedMIG == nil ||
		rec.Devices[0].CreatedMIG.UUID != now[0].UUID || rec.BootID != "boot-2" {
		t.Errorf("record after the reboot: %+v", rec)
	}
	if spec, _ := os.ReadFile(cdipkg.SpecPath(e.CDIRoot, "m")); !strings.Contains(string(spec), now[0].UUID) {
		t.Errorf("CDI spec does not name the new MIG device %s: %s", now[0].UUID, spec)
	}
	after, err := s.Prepare(e.Ctx, claim)
	if err != nil || !slices.Equal(cdiIDs(after), cdiIDs(before)) {
		t.Errorf("re-prepare after the reboot: %v, %v; want the CDI IDs %v", cdiIDs(after), err, cdiIDs(before))
	}
	checkSpecParses(t, e, "m", cdiIDs(before)...)
	if err := s.Unprepare(e.Ctx, "m"); err != nil || len(e.MIGDevices(t, 2)) != 0 {
		t.Errorf("unprepare: %v, MIG devices left %+v", err, e.MIGDevices(t, 2))
	}
}

// Item 9: with the CDI root on a tmpfs, the reboot takes the specs; a
// prepared claim's spec is written again, with the same device IDs.
func TestRebootRewritesCDISpec(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := preparetest.NewClaim("w").Device("gpu", "gpu-1").Build()
	before, err := e.state.Prepare(e.Ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	e.rebootMachine(t, &configapi.NodeConfig{}, true)
	if e.CDISpecExists("w") {
		t.Fatal("the simulated reboot kept the spec")
	}
	restartWith(t, e, claim)
	if !e.CDISpecExists("w") {
		t.Fatal("CDI spec not written again after the reboot")
	}
	checkSpecParses(t, e, "w", cdiIDs(before)...)
}

// Item 9: the reboot reset the time-slice interval and killed the MPS
// daemon and its compute mode; both are applied again for the claims that
// hold them, and released as before at unprepare.
func TestRebootReappliesSharing(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	ts := preparetest.NewClaim("ts").Device("gpu", "gpu-4-ts-0").Build()
	share := mpsShareClaim("mps", "10Gi").Build()
	for _, c := range []*resourceapi.ResourceClaim{ts, share} {
		if _, err := e.state.Prepare(e.Ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	run.take()
	e.rebootMachine(t, sharingNode(), true)
	s := restartWith(t, e, ts, share)
	got := run.take()
	interval := "nvidia-smi compute-policy -i " + e.GPUUUID(4) + " --set-timeslice=3"
	if !slices.Contains(got, interval) || !slices.ContainsFunc(got, func(c string) bool { return strings.HasPrefix(c, "nvidia-cuda-mps-control -d") }) {
		t.Errorf("commands after the reboot = %v; want the interval set and the MPS daemon started", got)
	}
	dev, _ := e.Lib.DeviceByUUID(e.GPUUUID(7))
	if mode, _ := dev.GetComputeMode(); mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode after the reboot = %v, want exclusive-process for MPS", mode)
	}
	if spec, _ := os.ReadFile(cdipkg.SpecPath(e.CDIRoot, "mps")); !strings.Contains(string(spec), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+e.GPUUUID(7)+"=10240M") {
		t.Errorf("MPS spec after the reboot lacks the client limits: %s", spec)
	}
	for _, uid := range []string{"ts", "mps"} {
		if err := s.Unprepare(e.Ctx, typesUID(uid)); err != nil {
			t.Fatal(err)
		}
	}
	if got := run.take(); !slices.Contains(got, "nvidia-smi compute-policy -i "+e.GPUUUID(4)+" --set-timeslice=0") ||
		!slices.Contains(got, "nvidia-cuda-mps-control quit") {
		t.Errorf("commands at unprepare = %v; want the interval and the daemon reset", got)
	}
}

// Item 9: records carry the boot ID, and a restart within the same boot
// makes nothing again: no tool runs, the MIG device is the one made at
// prepare, the record is not rewritten.
func TestRestartInSameBootChangesNothing(t *testing.T) {
	cfg := sharingNode()
	cfg.GPUs = append(cfg.GPUs, configapi.GpuModeSelector{Indexes: []int{2}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}})
	e := newTestEnvWith(t, "dgxh100", cfg)
	run := withTools(t, e)
	m := preparetest.NewClaim("m").Device("mig", e.Partition(t, 2, "1g.10gb")).Build()
	ts := preparetest.NewClaim("ts").Device("gpu", "gpu-4-ts-0").Build()
	for _, c := range []*resourceapi.ResourceClaim{m, ts} {
		if _, err := e.state.Prepare(e.Ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	run.take()
	made := e.MIGDevices(t, 2)
	files := map[string][]byte{}
	for _, uid := range []string{"m", "ts"} {
		if rec := e.record(t, uid); rec.BootID != "boot-1" {
			t.Errorf("record of %s has boot ID %q, want boot-1", uid, rec.BootID)
		}
		files[uid], _ = os.ReadFile(e.state.env.Store.Path(uid))
	}
	restartWith(t, e, m, ts)
	if got := run.take(); len(got) != 0 {
		t.Errorf("a restart in the same boot ran %v", got)
	}
	if now := e.MIGDevices(t, 2); !slices.Equal(now, made) {
		t.Errorf("MIG devices %+v after the restart, want %+v untouched", now, made)
	}
	for uid, before := range files {
		if after, _ := os.ReadFile(e.state.env.Store.Path(uid)); string(after) != string(before) {
			t.Errorf("record of %s rewritten by a restart in the same boot", uid)
		}
	}
}

// Item 9: after the reboot someone else's MIG device holds the claim's
// placement. The claim's promise is dropped: no spec, nothing destroyed,
// its prepare fails saying why, its unprepare cleans up.
func TestRebootWithPlacementTakenFailsPrepareClearly(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	part := e.PartitionAt(t, 2, "2g.20gb", 2)
	claim := preparetest.NewClaim("m").Device("mig", part.Name()).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	e.rebootMachine(t, preparetest.DynamicAll(), false)
	admin := e.adminMIG(t, 2, part.Partition().Profile, part.Partition().Placement)
	s := restartWith(t, e, claim)
	if e.CDISpecExists("m") || e.record(t, "m").State != checkpoint.PrepareLost {
		t.Errorf("spec kept %v, record %+v; want no spec and the claim recorded as lost", e.CDISpecExists("m"), e.record(t, "m"))
	}
	if now := e.MIGDevices(t, 2); len(now) != 1 || now[0] != admin {
		t.Errorf("MIG devices %+v, want only the admin's %s", now, admin.UUID)
	}
	_, err := s.Prepare(e.Ctx, claim)
	if !errors.Is(err, ErrLostInReboot) || !strings.Contains(err.Error(), "team-a/claim-m") {
		t.Errorf("prepare of the lost claim: %v", err)
	}
	if err := s.Unprepare(e.Ctx, "m"); err != nil || e.RecordExists("m") {
		t.Errorf("unprepare of the lost claim: %v, record kept %v", err, e.RecordExists("m"))
	}
	if now := e.MIGDevices(t, 2); len(now) != 1 {
		t.Errorf("unprepare destroyed the admin's MIG device: %+v", now)
	}
}

// Item 9: the plugin is killed while making a claim's MIG device again
// after the reboot; the next start tears that attempt down and makes it
// once more: one MIG device, recorded, no leak.
func TestRebootInterruptedReestablishmentIsRedone(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	claim := preparetest.NewClaim("m").Device("mig", e.PartitionAt(t, 2, "2g.20gb", 2).Name()).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	e.rebootMachine(t, preparetest.DynamicAll(), false)
	e.killDuringCreate(t, 2, afterComputeInstance)
	if !killedDuring(func() { restartWith(t, e, claim) }) {
		t.Fatal("the start after the reboot was not killed")
	}
	restartWith(t, e, claim)
	now := e.MIGDevices(t, 2)
	rec := e.record(t, "m")
	if len(now) != 1 || e.gpuInstances(t, 2) != 1 || rec.State != checkpoint.PrepareCompleted ||
		rec.Devices[0].CreatedMIG == nil || rec.Devices[0].CreatedMIG.UUID != now[0].UUID {
		t.Errorf("after the second start: MIG devices %+v in %d GPU instances, record %+v", now, e.gpuInstances(t, 2), rec)
	}
}

// Item 9: a prepare interrupted before the reboot left an intent; the
// reboot destroyed what it made, so the undo at the next start destroys
// nothing, not even what now sits at that placement.
func TestRebootUndoOfInterruptedPrepareDestroysNothing(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	part := e.PartitionAt(t, 2, "2g.20gb", 2)
	claim := preparetest.NewClaim("k").Device("mig", part.Name()).Build()
	e.killDuringCreate(t, 2, afterComputeInstance)
	if !killedDuring(func() { _, _ = e.state.Prepare(e.Ctx, claim) }) {
		t.Fatal("prepare was not killed")
	}
	e.rebootMachine(t, preparetest.DynamicAll(), false)
	admin := e.adminMIG(t, 2, part.Partition().Profile, part.Partition().Placement)
	restartWith(t, e, claim)
	if now := e.MIGDevices(t, 2); len(now) != 1 || now[0] != admin {
		t.Errorf("MIG devices %+v, want the admin's %s untouched", now, admin.UUID)
	}
	if e.RecordExists("k") {
		t.Error("record of the interrupted prepare kept")
	}
}
