package prepare

import (
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// Issue 25 item 1: a GPU that fell off the bus while claims were prepared
// on it used to make the next plugin process exit at enumeration, so those
// claims could never be unprepared (pods stuck Terminating). Now the
// restarted plugin comes up without that GPU and unprepares its claims:
// the dynamic MIG claim on it, whose MIG device
// cannot be destroyed while the GPU is lost (a reset destroys it).
func TestClaimsOnALostGPUAreUnpreparedAfterARestart(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", dynamicAll(), t.TempDir())
	mig := newClaim("m").device("mig", e.partitionAt(t, 2, "2g.20gb", 2).Name()).build()
	other := newClaim("o").device("gpu", e.partitionAt(t, 4, "1g.10gb", 0).Name()).build()
	for _, claim := range []*resourceapi.ResourceClaim{mig, other} {
		if _, err := e.state.Prepare(e.ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	if err := nvmock.SetGPULost(e.mockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}

	e.reopenMachine(t, dynamicAll())
	for _, g := range e.lib.GPUs() {
		if g.Index == 2 {
			t.Fatalf("the lost GPU is enumerated: %+v", g)
		}
	}
	if p := e.lib.Problems(); len(p) != 1 || !p[0].Lost {
		t.Fatalf("problems %v, want GPU 2 lost", p)
	}
	s := restartWith(t, e, mig, other)
	for _, uid := range []string{"m", "o"} {
		if err := s.Unprepare(e.ctx, types.UID(uid)); err != nil {
			t.Errorf("unpreparing %s: %v", uid, err)
		}
		if e.recordExists(uid) || e.cdiSpecExists(uid) {
			t.Errorf("claim %s still recorded (%v) or its CDI spec left (%v)", uid, e.recordExists(uid), e.cdiSpecExists(uid))
		}
	}
}

// The same for a time-slice replica and a whole GPU: their teardown asks
// the GPU nothing that a lost GPU must answer.
func TestReplicaAndWholeClaimsOnALostGPUAreUnprepared(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", everyMode(), t.TempDir())
	var replica, whole string
	for _, d := range e.devices {
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
		newClaim("r").device("gpu", replica).build(),
		newClaim("w").device("gpu", whole).build(),
	}
	for _, c := range claims {
		if _, err := e.state.Prepare(e.ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, gpu := range []string{"1", "3"} {
		if err := nvmock.SetGPULost(e.mockStateDir, gpu, true); err != nil {
			t.Fatal(err)
		}
	}
	e.reopenMachine(t, everyMode())
	s := restartWith(t, e, claims...)
	for _, uid := range []string{"r", "w"} {
		if err := s.Unprepare(e.ctx, types.UID(uid)); err != nil {
			t.Errorf("unpreparing %s: %v", uid, err)
		}
		if e.recordExists(uid) || e.cdiSpecExists(uid) {
			t.Errorf("claim %s still recorded or its CDI spec left", uid)
		}
	}
}
