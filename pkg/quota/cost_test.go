package quota

import (
	"context"
	"maps"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func sameCharge(a, b Charge) bool {
	return a.Units.Cmp(b.Units) == 0 && a.Memory == b.Memory &&
		maps.Equal(nonZero(a.Devices), nonZero(b.Devices))
}

func nonZero(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func TestDeviceUnits(t *testing.T) {
	noTotal := migDevice(0, "1g.10gb", 1, "10Gi")
	delete(noTotal.Attributes, AttrTotalComputeSlices)
	noSlices := migDevice(0, "3g.40gb", 3, "40Gi")
	delete(noSlices.Attributes, AttrComputeSlices)
	noReplicas := timesliceDevice(0, 0, 4)
	delete(noReplicas.Attributes, AttrReplicas)
	qualified := gpuDevice(0)
	delete(qualified.Attributes, AttrType)
	qualified.Attributes[DriverName+"/"+AttrType] = str(TypeMIG)
	qualified.Attributes[DriverName+"/"+AttrComputeSlices] = num(2)
	qualified.Attributes[DriverName+"/"+AttrTotalComputeSlices] = num(7)
	untyped := gpuDevice(0)
	delete(untyped.Attributes, AttrType)

	tests := []struct {
		name string
		dev  resourceapi.Device
		want Units
	}{
		{"whole GPU", gpuDevice(0), WholeUnits(1)},
		{"MIG 1g of 7", migDevice(0, "1g.10gb", 1, "10Gi"), NewUnits(1, 7)},
		{"MIG 3g of 7", migDevice(0, "3g.40gb", 3, "40Gi"), NewUnits(3, 7)},
		{"MIG 7g of 7", migDevice(0, "7g.80gb", 7, "80Gi"), WholeUnits(1)},
		{"MIG without total: a whole GPU", noTotal, WholeUnits(1)},
		{"MIG slices from the profile name", noSlices, NewUnits(3, 7)},
		{"time-slice replica of 4", timesliceDevice(0, 0, 4), NewUnits(1, 4)},
		{"time-slice without replicas: a whole GPU", noReplicas, WholeUnits(1)},
		{"shared device as a whole", sharedDevice(0, nil), WholeUnits(1)},
		{"qualified attribute names", qualified, NewUnits(2, 7)},
		{"no type: a whole GPU", untyped, WholeUnits(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, note := deviceUnits(&tt.dev, DriverName)
			if got.Cmp(tt.want) != 0 {
				t.Errorf("units = %s (%s), want %s", got, note, tt.want)
			}
		})
	}
}

func TestConsumedMemory(t *testing.T) {
	rng := &resourceapi.CapacityRequestPolicy{
		Default: ptr.To(resource.MustParse("10Gi")),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{
			Min: ptr.To(resource.MustParse("5Gi")), Max: ptr.To(resource.MustParse("40Gi")), Step: ptr.To(resource.MustParse("5Gi")),
		},
	}
	values := &resourceapi.CapacityRequestPolicy{ValidValues: []resource.Quantity{resource.MustParse("20Gi"), resource.MustParse("40Gi")}}
	tests := []struct {
		name    string
		policy  *resourceapi.CapacityRequestPolicy
		request string
		want    int64
		ok      bool
	}{
		{"no policy, no request: everything", nil, "", gi(80), true},
		{"no policy: as asked", nil, "12Gi", gi(12), true},
		{"more than the device has", nil, "81Gi", 0, false},
		{"policy default", rng, "", gi(10), true},
		{"rounded up to the step", rng, "12Gi", gi(15), true},
		{"raised to the minimum", rng, "1Gi", gi(5), true},
		{"above the range maximum", rng, "41Gi", 0, false},
		{"next valid value", values, "21Gi", gi(40), true},
		{"no valid value large enough", values, "50Gi", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := sharedDevice(0, tt.policy)
			d := &Device{Basic: raw, Memory: gi(80)}
			var req *resourceapi.CapacityRequirements
			if tt.request != "" {
				req = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{CapacityMemory: resource.MustParse(tt.request)}}
			}
			got, ok := consumedMemory(d, DriverName, req)
			if got != tt.want || ok != tt.ok {
				t.Errorf("consumedMemory = %d, %v; want %d, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestInventory(t *testing.T) {
	inv := testInventory()
	if inv.Get(DeviceID{DriverName, "node-b", "gpu-7"}) != nil {
		t.Error("device of an outdated pool generation was indexed")
	}
	if inv.Get(DeviceID{DriverName, "node-a", "gpu-1"}) == nil {
		t.Error("gpu-1 of node-a missing")
	}
	if inv.Get(DeviceID{"nic.example.com", "node-a", "eth0"}) != nil {
		t.Error("another driver's device was indexed")
	}
	if inv.Len() != 12 || inv.MaxMemory() != gi(80) {
		t.Errorf("Len = %d, MaxMemory = %d; want 12, 80Gi", inv.Len(), inv.MaxMemory())
	}
}

func TestClaimCost(t *testing.T) {
	tests := []struct {
		name string
		spec *resourceapi.ResourceClaimSpec
		want Charge
	}{
		{
			name: "two whole GPUs",
			spec: claimSpec(exact("gpu", "h100", 2)),
			want: charge(WholeUnits(2), gi(160), map[string]int64{"h100": 2}),
		},
		{
			name: "three 1g MIG slices",
			spec: claimSpec(exact("mig", "mig-1g", 3)),
			want: charge(NewUnits(3, 7), gi(30), map[string]int64{"mig-1g": 3}),
		},
		{
			// Each device can be a 1g or a 3g: both profiles' device limits
			// are charged (issue 12 item 9: only the class requested was).
			name: "any MIG device: the most expensive (3g) is charged, against every profile it can be",
			spec: claimSpec(exact("mig", "mig-any", 2)),
			want: charge(NewUnits(6, 7), gi(80), map[string]int64{"mig-any": 2, "mig-1g": 2, "mig-3g": 2}),
		},
		{
			name: "request selector narrows the class to 1g",
			spec: claimSpec(exact("mig", "mig-any", 1, withSelector(profileIs("1g.10gb")))),
			want: charge(NewUnits(1, 7), gi(10), map[string]int64{"mig-any": 1, "mig-1g": 1}),
		},
		{
			name: "time-slice replica",
			spec: claimSpec(exact("ts", "ts", 1)),
			want: charge(NewUnits(1, 4), gi(20), map[string]int64{"ts": 1}),
		},
		{
			name: "shared GPU share, rounded up to the policy step",
			spec: claimSpec(exact("s", "shared", 1, withMemory("12Gi"))),
			want: charge(NewUnits(15, 80), gi(15), map[string]int64{"shared": 1}),
		},
		{
			name: "shared GPU without a request takes the policy default",
			spec: claimSpec(exact("s", "shared", 1)),
			want: charge(NewUnits(1, 8), gi(10), map[string]int64{"shared": 1}),
		},
		{
			name: "firstAvailable: each resource at its most expensive alternative",
			spec: claimSpec(firstAvailable("gpu", exact("big", "h100", 1), exact("small", "mig-1g", 3))),
			want: charge(WholeUnits(1), gi(80), map[string]int64{"h100": 1, "mig-1g": 3}),
		},
		{
			name: "firstAvailable: two 3g slices cost less than the whole GPU alternative",
			spec: claimSpec(firstAvailable("gpu", exact("mig", "mig-3g", 2), exact("ts", "ts", 1))),
			want: charge(NewUnits(6, 7), gi(80), map[string]int64{"mig-3g": 2, "ts": 1}),
		},
		{
			name: "allocationMode All: what the largest node has",
			spec: claimSpec(exact("all", "h100", 0, allMode)),
			want: charge(WholeUnits(2), gi(160), map[string]int64{"h100": 2}),
		},
		{
			name: "allocationMode All of any device: node-b as a whole",
			spec: claimSpec(exact("all", "any", 0, allMode)),
			// 1 + 3x1/7 + 3/7 + 4x1/4 + shared 10/80
			want: charge(NewUnits(1, 1).Add(NewUnits(6, 7)).Add(WholeUnits(1)).Add(NewUnits(1, 8)),
				gi(80+30+40+80+10), map[string]int64{"any": 10, "h100": 2, "mig-1g": 3, "mig-3g": 1}),
		},
		{
			name: "admin access is never charged",
			spec: claimSpec(exact("watch", "h100", 2, adminAccess)),
			want: Charge{},
		},
		{
			name: "another driver's class costs nothing",
			spec: claimSpec(exact("nic", "nic", 1)),
			want: Charge{},
		},
		{
			// Issue 12 item 5: it was free, and allocated once the class
			// was created, past quota.
			name: "class that does not exist yet: a whole GPU and the largest memory",
			spec: claimSpec(exact("x", "not-yet", 1)),
			want: charge(WholeUnits(1), gi(80), map[string]int64{"not-yet": 1}),
		},
		{
			// Issue 12 item 5: allocationMode All over nothing published
			// was free.
			name: "allocationMode All before any device matches: every GPU of the largest node",
			spec: claimSpec(exact("all", "future", 0, allMode)),
			want: charge(WholeUnits(2), gi(160), map[string]int64{"future": 2}),
		},
		{
			name: "profile without devices yet: a whole GPU and the largest memory",
			spec: claimSpec(exact("x", "future", 2)),
			want: charge(WholeUnits(2), gi(160), map[string]int64{"future": 2}),
		},
		{
			name: "our class whose selector errors on every device: fallback",
			spec: claimSpec(exact("x", "broken", 1)),
			want: charge(WholeUnits(1), gi(80), map[string]int64{"broken": 1}),
		},
		{
			name: "several requests add up",
			spec: claimSpec(exact("a", "h100", 1), exact("b", "mig-1g", 1), exact("c", "nic", 1)),
			want: charge(NewUnits(8, 7), gi(90), map[string]int64{"h100": 1, "mig-1g": 1}),
		},
	}
	p := testPricer()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 2 { // the second round comes from the memo
				if got := p.ClaimCost(context.Background(), tt.spec); !sameCharge(got, tt.want) {
					t.Fatalf("ClaimCost = %s, want %s", got, tt.want)
				}
			}
		})
	}
}

func allocated(spec *resourceapi.ResourceClaimSpec, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{Spec: *spec}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return c
}

func result(request, pool, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: DriverName, Pool: pool, Device: device}
}

func TestAllocatedCost(t *testing.T) {
	sharedResult := result("s", "node-b", "gpu-6-shared")
	sharedResult.ShareID = ptr.To(types.UID("abc"))
	sharedResult.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{CapacityMemory: resource.MustParse("20Gi")}
	admin := result("watch", "node-a", "gpu-0")
	admin.AdminAccess = ptr.To(true)
	nic := resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "nic.example.com", Pool: "node-a", Device: "eth0"}

	tests := []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  Charge
	}{
		{
			name:  "the MIG slice it got, not the class's worst case, and the profile it is",
			claim: allocated(claimSpec(exact("mig", "mig-any", 1)), result("mig", "node-b", "gpu-1-mig-1g.10gb")),
			want:  charge(NewUnits(1, 7), gi(10), map[string]int64{"mig-any": 1, "mig-1g": 1}),
		},
		{
			name:  "whole GPU",
			claim: allocated(claimSpec(exact("gpu", "h100", 1)), result("gpu", "node-a", "gpu-1")),
			want:  charge(WholeUnits(1), gi(80), map[string]int64{"h100": 1}),
		},
		{
			name: "firstAvailable: charged to the alternative allocated",
			claim: allocated(claimSpec(firstAvailable("gpu", exact("big", "h100", 1), exact("small", "mig-1g", 2))),
				result("gpu/small", "node-b", "gpu-1-mig-1g.10gb"), result("gpu/small", "node-b", "gpu-2-mig-1g.10gb")),
			want: charge(NewUnits(2, 7), gi(20), map[string]int64{"mig-1g": 2}),
		},
		{
			name:  "shared GPU at the memory it consumed",
			claim: allocated(claimSpec(exact("s", "shared", 1, withMemory("18Gi"))), sharedResult),
			want:  charge(NewUnits(1, 4), gi(20), map[string]int64{"shared": 1}),
		},
		{
			name:  "admin access and other drivers cost nothing",
			claim: allocated(claimSpec(exact("watch", "h100", 1, adminAccess), exact("nic", "nic", 1)), admin, nic),
			want:  Charge{},
		},
		{
			name:  "device no longer published: the request's worst case",
			claim: allocated(claimSpec(exact("mig", "mig-any", 1)), result("mig", "node-gone", "gpu-9-mig")),
			want:  charge(NewUnits(3, 7), gi(40), map[string]int64{"mig-any": 1, "mig-1g": 1, "mig-3g": 1}),
		},
	}
	p := testPricer()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.Cost(context.Background(), tt.claim)
			if !got.Allocated || !sameCharge(got.Charge, tt.want) {
				t.Fatalf("Cost = %s (allocated %v), want %s", got.Charge, got.Allocated, tt.want)
			}
		})
	}
}

func TestCostOfUnallocatedClaimIsReserved(t *testing.T) {
	claim := &resourceapi.ResourceClaim{Spec: *claimSpec(exact("gpu", "h100", 1))}
	got := testPricer().Cost(context.Background(), claim)
	if got.Allocated || !sameCharge(got.Charge, charge(WholeUnits(1), gi(80), map[string]int64{"h100": 1})) {
		t.Fatalf("Cost = %+v", got)
	}
}

// Issue 26: the memo key joined a request's fields with separator bytes,
// which a CEL comment may contain. A selector whose comment held the
// separator and the text of a second selector keyed the same as the two
// selectors, so a dry run of the cheap two-selector claim priced the
// one-selector claim, which matches every device.
func TestClaimCostMemoKeyIsUnambiguous(t *testing.T) {
	cheap := claimSpec(exact("gpu", "any", 4, withSelector("true // x"), withSelector(profileIs("1g.10gb"))))
	dear := claimSpec(exact("gpu", "any", 4, withSelector("true // x\x00"+profileIs("1g.10gb"))))
	oldKey := func(r resourceapi.DeviceRequest) string { // the key before the fix
		key := r.Exactly.DeviceClassName
		for _, s := range r.Exactly.Selectors {
			key += "\x00" + s.CEL.Expression
		}
		return key
	}
	if oldKey(cheap.Devices.Requests[0]) != oldKey(dear.Devices.Requests[0]) {
		t.Fatal("the two claims must be the ones whose old keys collide")
	}
	want := testPricer().ClaimCost(t.Context(), dear)
	if want.Units.Cmp(WholeUnits(4)) != 0 || want.Devices["h100"] != 4 {
		t.Fatalf("fresh price of the comment-only selector = %s, want 4 whole GPUs (the comment selects nothing)", want)
	}
	p := testPricer()
	if got := p.ClaimCost(t.Context(), cheap); got.Units.Cmp(NewUnits(4, 7)) != 0 {
		t.Fatalf("cheap claim = %s, want 4/7", got)
	}
	if got := p.ClaimCost(t.Context(), dear); !sameCharge(got, want) {
		t.Errorf("after pricing the cheap claim, the dear one costs %s, want %s", got, want)
	}
	// The same with the capacity separator: a comment spelling a capacity
	// request keyed like the request.
	capped := exact("gpu", "shared", 1, withSelector("true // x"), withMemory("10Gi")).Exactly
	forged := exact("gpu", "shared", 1, withSelector("true // x\x01"+CapacityMemory+"=10Gi")).Exactly
	oldCapped := oldKey(resourceapi.DeviceRequest{Exactly: capped}) + "\x01" + CapacityMemory + "=10Gi"
	if oldCapped != oldKey(resourceapi.DeviceRequest{Exactly: forged}) {
		t.Fatal("the capacity pair must be one whose old keys collide")
	}
	if shapeKey(capped.DeviceClassName, capped.Selectors, capped.Capacity) == shapeKey(forged.DeviceClassName, forged.Selectors, forged.Capacity) {
		t.Error("a selector's comment keys the same as a capacity request")
	}
}

// Issue 26 item 8: a request shape was evaluated against every device with
// the request's context, and a walk the context cut short was remembered
// for the shape (CEL evaluation fails once the context ends, so the
// devices after the cut did not match): the next claim of the shape was
// priced from what the cut walk saw. Now an interrupted walk is refused as
// unpriced, charged no less than a device of ours can cost, and forgotten.
func TestInterruptedPricingIsNotRemembered(t *testing.T) {
	p := testPricer()
	req := exact("gpu", "gpu", 1, withSelector(`device.attributes["gpu.gpuaas.io"].type == "gpu"`))
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if got := p.Unpriced(cancelled, spec); len(got) != 1 || !got[0].Interrupted {
		t.Fatalf("priced with a cancelled context: %+v, want it refused as interrupted", got)
	}
	if c := p.ClaimCost(cancelled, spec); c.Units.Cmp(WholeUnits(1)) < 0 {
		t.Errorf("interrupted price %s, below a whole GPU", c.Units)
	}
	fresh := testPricer().ClaimCost(context.Background(), spec)
	if got := p.ClaimCost(context.Background(), spec); !sameCharge(got, fresh) {
		t.Errorf("after an interrupted walk the shape costs %+v, a fresh pricer says %+v", got, fresh)
	}
	if u := p.Unpriced(context.Background(), spec); len(u) != 0 {
		t.Errorf("after an interrupted walk: %+v, want priced", u)
	}
}

// Issue 55 route 5: an interrupted price is never remembered. The GpuProfiles
// a device belongs to were worked out under the claim's context and kept
// per device: a pricing cut short (its budget spent, its deadline) matched
// no profile, and every later claim allocated that device was charged
// none of its profiles' device limits.
func TestDeviceProfilesAreNotRememberedFromAnInterruptedPricing(t *testing.T) {
	p := testPricer()
	c := allocated(claimSpec(exact("mig", "mig-any", 1)), result("mig", "node-b", "gpu-1-mig-1g.10gb"))
	cut, cancel := context.WithCancel(context.Background())
	cancel()
	p.Cost(cut, c)
	want := charge(NewUnits(1, 7), gi(10), map[string]int64{"mig-any": 1, "mig-1g": 1})
	if got := p.Cost(context.Background(), c); !sameCharge(got.Charge, want) {
		t.Fatalf("after a pricing cut short, Cost = %s, want %s (the device's profiles forgotten)", got.Charge, want)
	}
}
