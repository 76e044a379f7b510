package prepare

import (
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// Issue 25 item 1: a GPU that fell off the bus while claims were prepared
// on it used to make the next plugin process exit at enumeration, so those
// claims could never be unprepared (pods stuck Terminating). Now the
// restarted plugin comes up without that GPU and unprepares its claims:
// the dynamic MIG claim on it, whose MIG device
// cannot be destroyed while the GPU is lost (a reset destroys it).
func TestClaimsOnALostGPUAreUnpreparedAfterARestart(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", preparetest.DynamicAll(), t.TempDir())
	mig := preparetest.NewClaim("m").Device("mig", e.PartitionAt(t, 2, "2g.20gb", 2).Name()).Build()
	other := preparetest.NewClaim("o").Device("gpu", e.PartitionAt(t, 4, "1g.10gb", 0).Name()).Build()
	for _, claim := range []*resourceapi.ResourceClaim{mig, other} {
		if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	if err := nvmock.SetGPULost(e.MockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}

	e.ReopenMachine(t, preparetest.DynamicAll())
	for _, g := range e.Lib.GPUs() {
		if g.Index == 2 {
			t.Fatalf("the lost GPU is enumerated: %+v", g)
		}
	}
	if p := e.Lib.Problems(); len(p) != 1 || !p[0].Lost {
		t.Fatalf("problems %v, want GPU 2 lost", p)
	}
	s := restartWith(t, e, mig, other)
	for _, uid := range []string{"m", "o"} {
		if err := s.Unprepare(e.Ctx, types.UID(uid)); err != nil {
			t.Errorf("unpreparing %s: %v", uid, err)
		}
		if e.RecordExists(uid) || e.CDISpecExists(uid) {
			t.Errorf("claim %s still recorded (%v) or its CDI spec left (%v)", uid, e.RecordExists(uid), e.CDISpecExists(uid))
		}
	}
}

// The same for a time-slice replica and a whole GPU: their teardown asks
// the GPU nothing that a lost GPU must answer.
func TestReplicaAndWholeClaimsOnALostGPUAreUnprepared(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", everyMode(), t.TempDir())
	var replica, whole string
	for _, d := range e.Devices {
		switch {
		case d.GPU.Index == 1 && d.Type() == device.TypeTimeSlice && replica == "":
			replica = d.Name()
		case d.GPU.Index == 1 && d.Type() == device.TypeGPU:
			t.Fatalf("GPU 1 offered whole too: %s", d.Name())
		case d.GPU.Index == 3 && d.Type() == device.TypeGPU:
			whole = d.Name()
		}
	}
	claims := []*resourceapi.ResourceClaim{
		preparetest.NewClaim("r").Device("gpu", replica).Build(),
		preparetest.NewClaim("w").Device("gpu", whole).Build(),
	}
	for _, c := range claims {
		if _, err := e.state.Prepare(e.Ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, gpu := range []string{"1", "3"} {
		if err := nvmock.SetGPULost(e.MockStateDir, gpu, true); err != nil {
			t.Fatal(err)
		}
	}
	e.ReopenMachine(t, everyMode())
	s := restartWith(t, e, claims...)
	for _, uid := range []string{"r", "w"} {
		if err := s.Unprepare(e.Ctx, types.UID(uid)); err != nil {
			t.Errorf("unpreparing %s: %v", uid, err)
		}
		if e.RecordExists(uid) || e.CDISpecExists(uid) {
			t.Errorf("claim %s still recorded or its CDI spec left", uid)
		}
	}
}
