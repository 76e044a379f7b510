package idle

import (
	"testing"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

func TestMetricsRegistered(t *testing.T) {
	RegisterMetrics()
	RegisterMetrics() // a second controller in the process must not panic
	idleClaims.WithLabelValues("t", "Evict").Set(0)
	idleActions.WithLabelValues("t", "Evict", resultDone).Add(0)
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"gpuaas_idle_claims": false, "gpuaas_idle_actions_total": false}
	for _, f := range families {
		if _, ok := want[f.GetName()]; ok {
			want[f.GetName()] = true
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("metric %s not on the controller-runtime registry", name)
		}
	}
}
