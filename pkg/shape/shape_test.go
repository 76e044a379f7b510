package shape

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

const (
	ourDriver = "gpu.gpuaas.io"
	nicDriver = "nic.example.com"
	pcieRoot  = "resource.kubernetes.io/pcieRoot"
	numaNode  = "resource.kubernetes.io/numaNode"
)

var (
	gpuSel = []string{`device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "gpu"`}
	nicSel = []string{`device.driver == "nic.example.com"`}
)

func slot() *gpuaas.GpuShape {
	return &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: "h100-slot", UID: "uid-1"},
		Spec: gpuaas.GpuShapeSpec{
			Requests: []gpuaas.ShapeRequest{
				{Name: "gpu", Profile: "h100"},
				{Name: "nic", DeviceClassName: "nic.example.com"},
			},
			Alignment: gpuaas.AlignPCIeRoot,
			Tenants:   []string{"team-a"},
		},
	}
}

func slotQuery() Query {
	return Query{Align: pcieRoot, Requests: []Request{{Name: "gpu", Selectors: gpuSel, Count: 1}, {Name: "nic", Selectors: nicSel, Count: 1}}}
}

func gpu(i int, root string, numa int64) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":   {StringValue: ptr.To("gpu")},
			pcieRoot: {StringValue: ptr.To(root)},
			numaNode: {IntValue: ptr.To(numa)},
		},
	}
}

func nic(i int, root string) resourceapi.Device {
	return resourceapi.Device{
		Name:       fmt.Sprintf("nic-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{pcieRoot: {StringValue: ptr.To(root)}},
	}
}

func slice(driver, node string, devs ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: driver + "-" + node},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: devs,
		},
	}
}

func claimOn(driver, node string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "c-" + node + strings.Join(devices, "-")}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver, Pool: node, Device: d})
	}
	return c
}

func TestClaimSpecAndTemplate(t *testing.T) {
	s := slot()
	tpl := Template(s, "team-a-ns")
	if tpl.Name != "h100-slot" || tpl.Namespace != "team-a-ns" || tpl.Labels[gpuaas.ShapeLabel] != "h100-slot" {
		t.Fatalf("template meta = %+v", tpl.ObjectMeta)
	}
	if ref := metav1.GetControllerOf(tpl); ref == nil || ref.Kind != gpuaas.GpuShapeKind || ref.UID != "uid-1" {
		t.Fatalf("owner = %+v", tpl.OwnerReferences)
	}
	spec := tpl.Spec.Spec.Devices
	if len(spec.Requests) != 2 || spec.Requests[0].Exactly.DeviceClassName != "h100" || spec.Requests[0].Exactly.Count != 1 ||
		spec.Requests[1].Exactly.DeviceClassName != "nic.example.com" {
		t.Fatalf("requests = %+v", spec.Requests)
	}
	if len(spec.Constraints) != 1 || *spec.Constraints[0].MatchAttribute != pcieRoot || len(spec.Constraints[0].Requests) != 0 {
		t.Fatalf("constraints = %+v", spec.Constraints)
	}
	whole := &gpuaas.GpuShape{Spec: gpuaas.GpuShapeSpec{Requests: []gpuaas.ShapeRequest{{Name: "gpus", Profile: "h100", AllocationMode: gpuaas.ShapeAll}}}}
	ws := ClaimSpec(whole)
	if r := ws.Devices.Requests[0].Exactly; r.AllocationMode != resourceapi.DeviceAllocationModeAll || r.Count != 0 || len(ws.Devices.Constraints) != 0 {
		t.Fatalf("whole-node spec = %+v %+v", r, ws.Devices.Constraints)
	}
	if got := Describe(whole); got != "GPUS (all of the node)" {
		t.Errorf("Describe(whole) = %q", got)
	}
	if got := Describe(s); got != "GPU+NIC on one PCIe root" {
		t.Errorf("Describe(slot) = %q", got)
	}
}

func TestSameClaim(t *testing.T) {
	s := slot()
	spec := ClaimSpec(s)
	if !SameClaim(s, &spec) {
		t.Fatal("the rendered spec is not the shape's")
	}
	edits := otherClaims()
	edits["renamed"] = func(c *resourceapi.ResourceClaimSpec) { c.Devices.Requests[0].Name = "x" }
	// More than the shape's devices: Instances counts the instance they
	// hold, but the claim is not the shape's.
	edits["count"] = func(c *resourceapi.ResourceClaimSpec) { c.Devices.Requests[0].Exactly.Count = 2 }
	edits["one more"] = func(c *resourceapi.ResourceClaimSpec) {
		c.Devices.Requests = append(c.Devices.Requests, c.Devices.Requests[0])
	}
	for name, edit := range edits {
		c := ClaimSpec(s)
		edit(&c)
		if SameClaim(s, &c) {
			t.Errorf("%s: a different claim counts as the shape", name)
		}
	}
}

// Instances is what a TenantQuota's shape cap counts: the shape's requests
// and alignment under any names, in any order; SameClaim (Refuse) keeps
// names and order. A claim that holds more than one instance's devices on
// one alignment counts what it holds.
func TestInstances(t *testing.T) {
	s := slot()
	spec := ClaimSpec(s)
	if n := Instances(s, &spec); n != 1 {
		t.Fatalf("the rendered spec: %d instances, want 1", n)
	}
	disguised := ClaimSpec(s)
	disguised.Devices.Requests[0].Name, disguised.Devices.Requests[1].Name = "b", "a"
	disguised.Devices.Requests[0], disguised.Devices.Requests[1] = disguised.Devices.Requests[1], disguised.Devices.Requests[0]
	if n := Instances(s, &disguised); n != 1 {
		t.Errorf("renamed and reordered requests: %d instances, want 1", n)
	}
	defaulted := ClaimSpec(s)
	defaulted.Devices.Requests[0].Exactly.AllocationMode, defaulted.Devices.Requests[0].Exactly.Count = "", 0
	if n := Instances(s, &defaulted); n != 1 {
		t.Errorf("a request left to the API's defaults (one device): %d instances, want 1", n)
	}
	for name, edit := range otherClaims() {
		c := ClaimSpec(s)
		edit(&c)
		if n := Instances(s, &c); n != 0 {
			t.Errorf("%s: a different claim counts %d instances", name, n)
		}
	}
	for name, edit := range map[string]func(*resourceapi.ResourceClaimSpec){
		"two GPUs, one NIC": func(c *resourceapi.ResourceClaimSpec) { c.Devices.Requests[0].Exactly.Count = 2 },
		"one more GPU": func(c *resourceapi.ResourceClaimSpec) {
			c.Devices.Requests = append(c.Devices.Requests, c.Devices.Requests[0])
		},
		"a second constraint on the NIC": func(c *resourceapi.ResourceClaimSpec) {
			c.Devices.Constraints = append(c.Devices.Constraints, resourceapi.DeviceConstraint{Requests: []string{"nic"},
				MatchAttribute: ptr.To[resourceapi.FullyQualifiedName](numaNode)})
		},
	} {
		c := ClaimSpec(s)
		edit(&c)
		if n := Instances(s, &c); n != 1 {
			t.Errorf("%s: %d instances, want 1 (it holds one instance's devices on one root)", name, n)
		}
	}
}

// A claim holds k instances of k disjoint copies, aligned by one
// constraint or one each; requests left out of every constraint on the
// alignment are not aligned; a constraint naming a firstAvailable
// alternative binds that alternative only.
func TestInstancesOfCopiesAndAlternatives(t *testing.T) {
	s := slot()
	exact := func(name, class string, count int64) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: count}}
	}
	onRoot := func(refs ...string) resourceapi.DeviceConstraint {
		return resourceapi.DeviceConstraint{Requests: refs, MatchAttribute: ptr.To[resourceapi.FullyQualifiedName](pcieRoot)}
	}
	alt := func(name string, subs ...resourceapi.DeviceSubRequest) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, FirstAvailable: subs}
	}
	for name, tc := range map[string]struct {
		spec resourceapi.DeviceClaim
		want int64
	}{
		"two copies, one constraint each": {resourceapi.DeviceClaim{
			Requests:    []resourceapi.DeviceRequest{exact("g1", "h100", 1), exact("n1", "nic.example.com", 1), exact("g2", "h100", 1), exact("n2", "nic.example.com", 1)},
			Constraints: []resourceapi.DeviceConstraint{onRoot("g1", "n1"), onRoot("g2", "n2")}}, 2},
		"three copies, counted": {resourceapi.DeviceClaim{
			Requests:    []resourceapi.DeviceRequest{exact("g", "h100", 3), exact("n", "nic.example.com", 3)},
			Constraints: []resourceapi.DeviceConstraint{onRoot()}}, 3},
		"a NIC left unaligned": {resourceapi.DeviceClaim{
			Requests:    []resourceapi.DeviceRequest{exact("g1", "h100", 1), exact("n1", "nic.example.com", 1), exact("g2", "h100", 1), exact("n2", "nic.example.com", 1)},
			Constraints: []resourceapi.DeviceConstraint{onRoot("g1", "n1", "g2")}}, 1},
		"worst alternative": {resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{alt("g", resourceapi.DeviceSubRequest{Name: "a100", DeviceClassName: "a100", Count: 1},
				resourceapi.DeviceSubRequest{Name: "h100", DeviceClassName: "h100", Count: 2}), exact("n", "nic.example.com", 2)},
			Constraints: []resourceapi.DeviceConstraint{onRoot()}}, 2},
		"a constraint on the other alternative": {resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{alt("g", resourceapi.DeviceSubRequest{Name: "a100", DeviceClassName: "a100", Count: 1},
				resourceapi.DeviceSubRequest{Name: "h100", DeviceClassName: "h100", Count: 1}), exact("n", "nic.example.com", 1)},
			Constraints: []resourceapi.DeviceConstraint{onRoot("g/a100", "n")}}, 0},
		"admin access holds nothing": {resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "h100", AdminAccess: ptr.To(true)}},
				exact("n", "nic.example.com", 1)},
			Constraints: []resourceapi.DeviceConstraint{onRoot()}}, 0},
	} {
		spec := resourceapi.ResourceClaimSpec{Devices: tc.spec}
		if n := Instances(s, &spec); n != tc.want {
			t.Errorf("%s: %d instances, want %d", name, n, tc.want)
		}
	}
}

// otherClaims edit the slot's rendered spec into claims of other devices
// or another alignment: neither the shape's claim nor an instance of it.
func otherClaims() map[string]func(*resourceapi.ResourceClaimSpec) {
	return map[string]func(*resourceapi.ResourceClaimSpec){
		"class":    func(c *resourceapi.ResourceClaimSpec) { c.Devices.Requests[1].Exactly.DeviceClassName = "other" },
		"no align": func(c *resourceapi.ResourceClaimSpec) { c.Devices.Constraints = nil },
		"numa align": func(c *resourceapi.ResourceClaimSpec) {
			c.Devices.Constraints[0].MatchAttribute = ptr.To[resourceapi.FullyQualifiedName](numaNode)
		},
	}
}

func TestMissingParts(t *testing.T) {
	s := slot()
	s.Spec.Requests = append(s.Spec.Requests, gpuaas.ShapeRequest{Name: "mig", Profile: "mig-1g"}, gpuaas.ShapeRequest{Name: "x", Profile: "gone"})
	parts := Parts{
		Profiles: map[string]*gpuaas.GpuProfile{
			"h100":   {ObjectMeta: metav1.ObjectMeta{Name: "h100"}},
			"mig-1g": {ObjectMeta: metav1.ObjectMeta{Name: "mig-1g"}, Spec: gpuaas.GpuProfileSpec{Enabled: ptr.To(false)}},
		},
		Classes: map[string]*resourceapi.DeviceClass{"h100": {}},
	}
	got := strings.Join(Missing(s, parts), "; ")
	want := `request nic: DeviceClass "nic.example.com" does not exist; request mig: GpuProfile "mig-1g" is disabled; request x: GpuProfile "gone" does not exist`
	if got != want {
		t.Fatalf("Missing = %q\nwant      %q", got, want)
	}
	parts.Classes["nic.example.com"] = &resourceapi.DeviceClass{}
	if m := Missing(slot(), parts); len(m) != 0 {
		t.Fatalf("complete shape misses %v", m)
	}
}

func TestPlaceableAlignedSlots(t *testing.T) {
	tainted := gpu(0, "r0", 0)
	tainted.Taints = []resourceapi.DeviceTaint{{Key: "gpu.gpuaas.io/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	slices := []*resourceapi.ResourceSlice{
		// a: GPUs on r0 and r1, a NIC on r0 only: one slot.
		slice(ourDriver, "a", gpu(0, "r0", 0), gpu(1, "r1", 1)), slice(nicDriver, "a", nic(0, "r0")),
		// b: two roots with a GPU and a NIC each, the GPU of r0 allocated: one slot.
		slice(ourDriver, "b", gpu(0, "r0", 0), gpu(1, "r1", 1)), slice(nicDriver, "b", nic(0, "r0"), nic(1, "r1")),
		// c: its only GPU is tainted, NIC on a root without a GPU: none.
		slice(ourDriver, "c", tainted, gpu(1, "r1", 1)), slice(nicDriver, "c", nic(0, "r0")),
		// d: four aligned pairs.
		slice(ourDriver, "d", gpu(0, "r0", 0), gpu(1, "r1", 0), gpu(2, "r2", 1), gpu(3, "r3", 1)),
		slice(nicDriver, "d", nic(0, "r0"), nic(1, "r1"), nic(2, "r2"), nic(3, "r3")),
	}
	claims := []*resourceapi.ResourceClaim{claimOn(ourDriver, "b", "gpu-0")}
	got := Placeable(t.Context(), slotQuery(), slices, claims, nil)
	if got != (Count{Placeable: 6, Nodes: 4, NodesWithRoom: 3}) {
		t.Fatalf("Placeable = %+v", got)
	}
	if msg := got.Message(Describe(slot())); msg != "3 of 4 nodes have a free GPU+NIC on one PCIe root" {
		t.Errorf("message = %q", msg)
	}
	// Without alignment, node a's GPU of r1 pairs too... but it has one NIC.
	q := slotQuery()
	q.Align = ""
	if got := Placeable(t.Context(), q, slices, claims, nil); got.Placeable != 1+1+1+4 {
		t.Errorf("unaligned Placeable = %+v", got)
	}
	// NUMA: d has two NUMA nodes, each with two GPUs; two GPUs per instance.
	two := Query{Align: numaNode, Requests: []Request{{Name: "gpu", Selectors: gpuSel, Count: 2}}}
	if got := Placeable(t.Context(), two, slices, claims, nil); got.Placeable != 2 || got.NodesWithRoom != 1 {
		t.Errorf("2 GPUs per NUMA node: %+v", got)
	}
}

// TestPlaceableLeavesOutDrainedDevices: an admin's DeviceTaintRule keeps
// new claims off what it selects (any driver's device), as the scheduler
// applies it, so the count does not offer it (make demo showed a NUMA pair
// placeable on a GPU drained by a rule); a rule with effect None, or one
// selecting another pool, changes nothing.
func TestPlaceableLeavesOutDrainedDevices(t *testing.T) {
	slices := []*resourceapi.ResourceSlice{
		slice(ourDriver, "d", gpu(0, "r0", 0), gpu(1, "r1", 0), gpu(2, "r2", 1), gpu(3, "r3", 1)),
		slice(nicDriver, "d", nic(0, "r0"), nic(1, "r1"), nic(2, "r2"), nic(3, "r3")),
	}
	rule := func(effect resourceapi.DeviceTaintEffect, driver, pool, device string) *resourceapi.DeviceTaintRule {
		return &resourceapi.DeviceTaintRule{Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(driver), Pool: ptr.To(pool), Device: ptr.To(device)},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/drain", Effect: effect},
		}}
	}
	two := Query{Align: numaNode, Requests: []Request{{Name: "gpu", Selectors: gpuSel, Count: 2}}}
	for _, tc := range []struct {
		name  string
		q     Query
		rules []*resourceapi.DeviceTaintRule
		want  int
	}{
		{"no rule", two, nil, 2},
		{"gpu-3 drained", two, []*resourceapi.DeviceTaintRule{rule(resourceapi.DeviceTaintEffectNoSchedule, ourDriver, "d", "gpu-3")}, 1},
		{"gpu-3 evicted", two, []*resourceapi.DeviceTaintRule{rule(resourceapi.DeviceTaintEffectNoExecute, ourDriver, "d", "gpu-3")}, 1},
		{"informational", two, []*resourceapi.DeviceTaintRule{rule(resourceapi.DeviceTaintEffectNone, ourDriver, "d", "gpu-3")}, 2},
		{"another pool", two, []*resourceapi.DeviceTaintRule{rule(resourceapi.DeviceTaintEffectNoSchedule, ourDriver, "e", "gpu-3")}, 2},
		{"a NIC drained", slotQuery(), []*resourceapi.DeviceTaintRule{rule(resourceapi.DeviceTaintEffectNoSchedule, nicDriver, "d", nic(0, "r0").Name)}, 3},
	} {
		if got := Placeable(t.Context(), tc.q, slices, nil, tc.rules); got.Placeable != tc.want {
			t.Errorf("%s: placeable %d, want %d", tc.name, got.Placeable, tc.want)
		}
	}
}

// A whole GPU shares its counters with its MIG devices: while one of them
// is allocated the whole GPU is not free, nor is a whole-node lease.
func TestPlaceableCountersAndAll(t *testing.T) {
	counters := func(n int64) map[string]resourceapi.Counter {
		return map[string]resourceapi.Counter{"memory-slice-0": {Value: *resource.NewQuantity(n, resource.DecimalSI)}}
	}
	consumes := func(set string) []resourceapi.DeviceCounterConsumption {
		return []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: counters(1)}}
	}
	node := func(name string) []*resourceapi.ResourceSlice {
		g0, g1 := gpu(0, "r0", 0), gpu(1, "r1", 0)
		g0.ConsumesCounters, g1.ConsumesCounters = consumes("gpu-0-counters"), consumes("gpu-1-counters")
		mig := resourceapi.Device{Name: "gpu-0-mig-1g-0", ConsumesCounters: consumes("gpu-0-counters"),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("mig")}}}
		s := slice(ourDriver, name, g0, g1, mig)
		s.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "gpu-0-counters", Counters: counters(1)}, {Name: "gpu-1-counters", Counters: counters(1)}}
		return []*resourceapi.ResourceSlice{s}
	}
	slices := append(node("a"), node("b")...)
	claims := []*resourceapi.ResourceClaim{claimOn(ourDriver, "a", "gpu-0-mig-1g-0")}
	one := Query{Requests: []Request{{Name: "gpu", Selectors: gpuSel, Count: 1}}}
	if got := Placeable(t.Context(), one, slices, claims, nil); got.Placeable != 3 {
		t.Errorf("whole GPUs free with a MIG device of a's gpu-0 taken: %+v, want 3", got)
	}
	all := Query{Requests: []Request{{Name: "gpus", Selectors: gpuSel, All: true}}}
	if got := Placeable(t.Context(), all, slices, claims, nil); got != (Count{Placeable: 1, Nodes: 2, NodesWithRoom: 1}) {
		t.Errorf("whole-node leases: %+v, want only b", got)
	}
	// Once the lease holds b, no MIG device of b fits.
	lease := claimOn(ourDriver, "b", "gpu-0", "gpu-1")
	migSel := []string{`device.attributes["gpu.gpuaas.io"].type == "mig"`}
	mig := Query{Requests: []Request{{Name: "mig", Selectors: migSel, Count: 1}}}
	if got := Placeable(t.Context(), mig, slices, []*resourceapi.ResourceClaim{lease}, nil); got.Placeable != 1 || got.NodesWithRoom != 1 {
		t.Errorf("MIG devices with b leased whole: %+v, want a's only", got)
	}
}
