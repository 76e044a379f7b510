package plugin

import (
	"errors"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/usage"
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

// The Idle condition goes in the same apply as Ready and Healthy: one
// field manager owns the entry, and an apply without a condition drops it.
func TestStatusWriterAppliesIdleWithReadyAndHealthy(t *testing.T) {
	store, err := checkpoint.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec := &checkpoint.Claim{UID: "c1", Namespace: "team-a", Name: "notebook", State: checkpoint.PrepareCompleted,
		Devices: []checkpoint.Device{{Pool: testNode, Device: "gpu-0", GPUUUID: "GPU-0"}}}
	if err := store.Save(rec); err != nil {
		t.Fatal(err)
	}
	sampler := usage.New(usage.Options{})
	started := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	sampler.Track(rec, started)
	w := newStatusWriter(nil, testNode, store, func() map[string]*device.AllocatableDevice { return nil }, func() []health.Fault { return nil })
	w.idle = sampler.Condition
	claim, err := w.desired("c1")
	if err != nil || claim == nil {
		t.Fatalf("status of c1: %v, %v", claim, err)
	}
	conds := map[string]string{}
	var idleSince metav1.Time
	for _, c := range claim.Status.Devices[0].Conditions {
		conds[*c.Type] = string(*c.Status) + "/" + *c.Reason
		if *c.Type == gpuaasv1.DeviceConditionIdle {
			idleSince = *c.LastTransitionTime
		}
	}
	want := map[string]string{"Ready": "True/Prepared", "Healthy": "True/NoFault", gpuaasv1.DeviceConditionIdle: "Unknown/" + gpuaasv1.ReasonIdleNoSamples}
	if !reflect.DeepEqual(conds, want) {
		t.Errorf("conditions %v, want %v", conds, want)
	}
	if !idleSince.Time.Equal(started) {
		t.Errorf("Idle since %s, want the start of tracking %s", idleSince, started)
	}
}
