package kueue

import (
	"fmt"
	"slices"

	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Milliunits is a number of GPU units in thousandths, rounded down: a
// ClusterQueue mirroring a TenantQuota never lets Kueue admit more than
// the TenantQuota allows.
func Milliunits(units resource.Quantity) int64 {
	d := new(inf.Dec).Mul(units.AsDec(), inf.NewDec(1000, 0))
	return new(inf.Dec).Round(d, 0, inf.RoundDown).UnscaledBig().Int64()
}

// TenantQueue is what a ClusterQueue mirrors of a TenantQuota.
type TenantQueue struct {
	Namespaces []string
	Cohort     string
	GpuUnits   resource.Quantity
	// Borrowing is the tenant's borrowingLimit.gpuUnits; nil: no limit.
	Borrowing *resource.Quantity
}

// ClusterQueueSpec renders the fields of a ClusterQueue's spec that mirror a
// tenant, as unstructured content: the namespaces it serves, its cohort,
// and one resource group charging DefaultResource in Flavor. Fields it does
// not set (preemption, fair sharing, queueing strategy) are left to the
// admin.
func ClusterQueueSpec(t TenantQueue) (map[string]any, error) {
	if len(t.Namespaces) == 0 {
		return nil, fmt.Errorf("the tenant has no namespaces yet")
	}
	names := make([]any, 0, len(t.Namespaces))
	for _, ns := range slices.Sorted(slices.Values(t.Namespaces)) {
		names = append(names, ns)
	}
	quota := map[string]any{"name": DefaultResource, "nominalQuota": fmt.Sprint(Milliunits(t.GpuUnits))}
	if t.Borrowing != nil {
		quota["borrowingLimit"] = fmt.Sprint(Milliunits(*t.Borrowing))
	}
	spec := map[string]any{
		"namespaceSelector": map[string]any{"matchExpressions": []any{map[string]any{
			"key": "kubernetes.io/metadata.name", "operator": "In", "values": names,
		}}},
		// OtherDevicesResource is covered so that workloads of shapes
		// with other drivers' devices are admissible; its quota never
		// binds.
		"resourceGroups": []any{map[string]any{
			"coveredResources": []any{DefaultResource, OtherDevicesResource},
			"flavors": []any{map[string]any{"name": Flavor, "resources": []any{quota,
				map[string]any{"name": OtherDevicesResource, "nominalQuota": fmt.Sprint(OtherDevicesQuota)}}}},
		}},
	}
	if t.Cohort != "" {
		spec["cohortName"] = t.Cohort
	}
	return spec, nil
}
