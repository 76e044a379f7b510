package kubeletsim

import (
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

const (
	opPrepare   = resourceapi.SkipNodeOperationNodePrepareResources
	opUnprepare = resourceapi.SkipNodeOperationNodeUnprepareResources
	opAll       = resourceapi.SkipNodeOperationAll
)

func result(driver string, skips ...resourceapi.SkipNodeOperation) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Driver: driver, Pool: "node", Device: "dev", Request: "req", SkipNodeOperations: skips}
}

func allocatedClaim(name string, uid types.UID, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: uid},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

func TestDriverSkips(t *testing.T) {
	tests := []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		want    map[string][]resourceapi.SkipNodeOperation
	}{
		{
			name:    "one driver, nothing skipped",
			results: []resourceapi.DeviceRequestAllocationResult{result("gpu.gpuaas.io"), result("gpu.gpuaas.io")},
			want:    map[string][]resourceapi.SkipNodeOperation{"gpu.gpuaas.io": nil},
		},
		{
			name:    "two drivers",
			results: []resourceapi.DeviceRequestAllocationResult{result("a.example.com"), result("b.example.com", opAll)},
			want: map[string][]resourceapi.SkipNodeOperation{
				"a.example.com": nil,
				"b.example.com": {opPrepare, opUnprepare},
			},
		},
		{
			name: "skipped only when every device of the driver skips",
			results: []resourceapi.DeviceRequestAllocationResult{
				result("a.example.com", opAll), result("a.example.com", opUnprepare),
			},
			want: map[string][]resourceapi.SkipNodeOperation{"a.example.com": {opUnprepare}},
		},
		{
			name:    "unknown operations are ignored",
			results: []resourceapi.DeviceRequestAllocationResult{result("a.example.com", "Future", opUnprepare)},
			want:    map[string][]resourceapi.SkipNodeOperation{"a.example.com": {opUnprepare}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := driverSkips(tt.results); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("driverSkips() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNewClaimInfoNotAllocated(t *testing.T) {
	claim := allocatedClaim("c", "uid")
	claim.Status.Allocation = nil
	if _, err := newClaimInfo(claim); err == nil {
		t.Fatal("newClaimInfo of an unallocated claim: no error")
	}
}

func TestGroupByDriver(t *testing.T) {
	mustInfo := func(c *resourceapi.ResourceClaim) *claimInfo {
		info, err := newClaimInfo(c)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	one := mustInfo(allocatedClaim("one", "uid-1", result("gpu.gpuaas.io")))
	two := mustInfo(allocatedClaim("two", "uid-2", result("gpu.gpuaas.io"), result("nic.example.com", opPrepare, opUnprepare)))
	three := mustInfo(allocatedClaim("three", "uid-3", result("nic.example.com", opUnprepare)))

	got := groupByDriver([]*claimInfo{one, two, three}, opPrepare)
	want := map[string][]*drapb.Claim{
		"gpu.gpuaas.io": {
			{Namespace: "ns", Uid: "uid-1", Name: "one"},
			{Namespace: "ns", Uid: "uid-2", Name: "two"},
		},
		"nic.example.com": {{Namespace: "ns", Uid: "uid-3", Name: "three"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("prepare batches = %v, want %v", got, want)
	}
	got = groupByDriver([]*claimInfo{one, two, three}, opUnprepare)
	if len(got) != 1 || len(got["gpu.gpuaas.io"]) != 2 {
		t.Errorf("unprepare batches = %v, want only gpu.gpuaas.io with two claims", got)
	}
}

func TestClaimCacheSharedClaim(t *testing.T) {
	c := newClaimCache()
	fresh := func() *claimInfo {
		info, err := newClaimInfo(allocatedClaim("shared", "uid-1", result("gpu.gpuaas.io")))
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	a, err := c.attach(fresh(), "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	a.Prepared = true
	b, err := c.attach(fresh(), "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	if a != b || !b.Prepared {
		t.Fatal("second pod did not find the prepared cache entry")
	}
	if last := c.detach("pod-a"); len(last) != 0 {
		t.Fatalf("detach of first pod returned %d claims to unprepare, want 0 (still used)", len(last))
	}
	last := c.detach("pod-b")
	if len(last) != 1 || !last[0].Unpreparing {
		t.Fatalf("detach of last pod = %v, want the claim, marked unpreparing", last)
	}
	if _, err := c.attach(fresh(), "pod-c"); err == nil {
		t.Error("attach to a claim being unprepared: no error")
	}
	c.remove(last)
	if len(c.claims) != 0 {
		t.Errorf("cache not empty after remove: %v", c.claims)
	}
}

func TestClaimCacheRejectsReplacedClaim(t *testing.T) {
	c := newClaimCache()
	old, _ := newClaimInfo(allocatedClaim("c", "uid-old", result("gpu.gpuaas.io")))
	if _, err := c.attach(old, "pod-a"); err != nil {
		t.Fatal(err)
	}
	replaced, _ := newClaimInfo(allocatedClaim("c", "uid-new", result("gpu.gpuaas.io")))
	if _, err := c.attach(replaced, "pod-b"); err == nil {
		t.Error("attach of a claim with the same name and another UID: no error")
	}
}

func TestCDIDeviceIDs(t *testing.T) {
	info := &claimInfo{Devices: map[string][]*drapb.Device{
		"b": {{CdiDeviceIds: []string{"vendor/class=z", "vendor/class=a"}}},
		"a": {{CdiDeviceIds: []string{"vendor/class=a"}}},
	}}
	want := []string{"vendor/class=a", "vendor/class=z"}
	if got := info.CDIDeviceIDs(); !reflect.DeepEqual(got, want) {
		t.Errorf("CDIDeviceIDs() = %v, want %v", got, want)
	}
}
