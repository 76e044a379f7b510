package billing

import (
	"testing"
	"time"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// The records of claims of two kinds through the controller's own meter
// (the Accountant): a whole H100 and a 1g slice, each its profile, model,
// node, units and memory, and the two profiles' prices.
func TestRecordsThroughTheAccountant(t *testing.T) {
	objs := testworld.World(t)
	for _, o := range objs {
		if p, ok := o.(*gpuaas.GpuProfile); ok {
			p.Spec.Price = priceOf(map[string]string{"h100": "7", "mig-1g": "14"}[p.Name])
		}
	}
	objs = append(objs, testworld.Namespace("ns-a", nil), testworld.TeamQuota("team-a", "ns-a", "8"),
		testworld.AllocatedTo(testworld.Claim("ns-a", "whole", "h100", 1), "node-a", "gpu-0"),
		testworld.AllocatedTo(testworld.Claim("ns-a", "slice", "mig-1g", 1), "node-b", "gpu-0-mig-1g-3"))
	api := newAPI(t, objs...)
	clk := newClock()
	r := newRecorder(api, clk)
	r.Meter = admission.NewAccountant(api, api, admission.NewLedger(api, "gpuaas"))
	reconcileOK(t, r)
	clk.advance(time.Hour)
	for _, name := range []string{"whole", "slice"} {
		deleteClaim(t, api, name)
	}
	reconcileOK(t, r)
	closed := closedIn(usageIn(t, api, usageName()))
	whole, slice := closed["whole/node-a/gpu-0"], closed["slice/node-b/gpu-0-mig-1g-3"]
	wantRecord(t, whole, t0, at(time.Hour), "3600", "7.000000")
	wantRecord(t, slice, t0, at(time.Hour), "3600/7", "2.000000")
	for _, c := range []struct {
		rec                          gpuaas.UsageRecord
		profile, node, units, memory string
	}{{whole, "h100", "node-a", "1", "80Gi"}, {slice, "mig-1g", "node-b", "1/7", "10Gi"}} {
		if c.rec.Profile != c.profile || c.rec.Node != c.node || c.rec.Units != c.units ||
			c.rec.Memory.Cmp(qty(c.memory)) != 0 || c.rec.GpuModel != "NVIDIA H100 80GB HBM3" || c.rec.Tenant != "team-a" {
			t.Errorf("record %s: %+v; want profile %s, node %s, %s unit, %s, an H100 of team-a", c.rec.Claim, c.rec, c.profile, c.node, c.units, c.memory)
		}
	}
	_, _, cost, _ := r.Totals()
	if got := cost[costKey{"team-a", "mig-1g", "NVIDIA H100 80GB HBM3"}].FloatString(6); got != "2.000000" {
		t.Errorf("cost counter of the slice: %s, want 2.000000", got)
	}
}
