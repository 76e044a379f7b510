package kueue

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestMilliunitsRoundDown(t *testing.T) {
	for in, want := range map[string]int64{"1": 1000, "1.5": 1500, "0.3": 300, "2.0005": 2000, "0": 0, "7": 7000} {
		if got := Milliunits(resource.MustParse(in)); got != want {
			t.Errorf("Milliunits(%s) = %d, want %d", in, got, want)
		}
	}
}

func TestClusterQueueSpecMirrorsTheTenant(t *testing.T) {
	borrow := resource.MustParse("0.5")
	spec, err := ClusterQueueSpec(TenantQueue{Namespaces: []string{"b", "a"}, Cohort: "research",
		GpuUnits: resource.MustParse("1.5"), Borrowing: &borrow})
	if err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{"spec": spec}
	values, _, _ := unstructured.NestedSlice(obj, "spec", "namespaceSelector", "matchExpressions")
	if got := values[0].(map[string]any)["values"]; !reflect.DeepEqual(got, []any{"a", "b"}) {
		t.Errorf("namespaces %v, want [a b]", got)
	}
	if c, _, _ := unstructured.NestedString(obj, "spec", "cohortName"); c != "research" {
		t.Errorf("cohort %q", c)
	}
	groups, _, _ := unstructured.NestedSlice(obj, "spec", "resourceGroups")
	flavor := groups[0].(map[string]any)["flavors"].([]any)[0].(map[string]any)
	quota := flavor["resources"].([]any)[0].(map[string]any)
	if flavor["name"] != Flavor || quota["name"] != DefaultResource || quota["nominalQuota"] != "1500" || quota["borrowingLimit"] != "500" {
		t.Errorf("resource group %v", groups[0])
	}
	// Workloads of shapes with another driver's devices are admissible:
	// the queue covers the resource those are counted as, without limit.
	covered, _ := groups[0].(map[string]any)["coveredResources"].([]any)
	other, _ := flavor["resources"].([]any)[1].(map[string]any)
	if len(covered) != 2 || covered[1] != OtherDevicesResource || other["name"] != OtherDevicesResource || other["nominalQuota"] != "1000000" {
		t.Errorf("resource group %v does not cover %s", groups[0], OtherDevicesResource)
	}
	if _, err := ClusterQueueSpec(TenantQueue{GpuUnits: resource.MustParse("1")}); err == nil {
		t.Error("a tenant without namespaces rendered a ClusterQueue that selects nothing")
	}
}
