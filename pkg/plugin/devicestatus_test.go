package plugin

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// What the status writer keeps of a claim (a failed prepare, its
// conditions' transition times) goes when the claim is unprepared: on a
// node that runs claims for months, its maps must not only grow.
func TestStatusWriterForgetsUnpreparedClaims(t *testing.T) {
	store, err := checkpoint.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := newStatusWriter(nil, testNode, store, func() map[string]*device.AllocatableDevice { return nil }, func() []health.Fault { return nil })
	failed := preparetest.NewClaim("failed").Device("gpu", "gpu-0").Build()
	w.prepared(failed, errors.New("no luck"))
	if err := store.Save(&checkpoint.Claim{UID: "prepared", Namespace: "team-a", Name: "claim-prepared", State: checkpoint.PrepareCompleted,
		Devices: []checkpoint.Device{{Pool: testNode, Device: "gpu-1", GPUUUID: "GPU-1"}}}); err != nil {
		t.Fatal(err)
	}
	w.prepared(preparetest.NewClaim("prepared").Device("gpu", "gpu-1").Build(), nil)
	for _, uid := range []string{"failed", "prepared"} {
		if c, err := w.desired(types.UID(uid)); err != nil || c == nil {
			t.Fatalf("status of %s: %v, %v", uid, c, err)
		}
	}
	if len(w.since) == 0 || len(w.failures) == 0 {
		t.Fatalf("nothing kept to forget: since %v, failures %v", w.since, w.failures)
	}
	if err := store.Delete("prepared"); err != nil {
		t.Fatal(err)
	}
	w.unprepared("failed")
	w.unprepared("prepared")
	if len(w.since) != 0 || len(w.failures) != 0 {
		t.Errorf("after both claims were unprepared the writer keeps since %v, failures %v", w.since, w.failures)
	}
}
