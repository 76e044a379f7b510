package admission

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllertest"
	"sigs.k8s.io/controller-runtime/pkg/event"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// catalogEvent is one informer event and whether it may move a price.
type catalogEvent struct {
	name       string
	event      func(*informertest.FakeInformers)
	invalidate bool
}

// TestWatchInvalidatesTheCatalogOnPricedChangesOnly (issues 52 and 55,
// route 5): the catalog snapshot, with its pricer's memo and every claim's
// cached charge, is thrown away only by a change that can move a price.
// A device taint (health), another driver's slice, a GpuProfile status
// write (the profile reconciler's, about a second after any allocation)
// and a DeviceClass write that leaves its spec alone move none; before,
// each made the next admission re-price every claim of its cohort.
func TestWatchInvalidatesTheCatalogOnPricedChangesOnly(t *testing.T) {
	ctx := context.Background()
	informers := &informertest.FakeInformers{Scheme: fakeScheme(t)}
	acct, _ := newAccountant(t)
	if err := Watch(ctx, informers, acct, NewNudger(nil, false)); err != nil {
		t.Fatal(err)
	}
	for _, c := range catalogEvents(t) {
		before := acct.catalogGen.Load()
		c.event(informers)
		if got := acct.catalogGen.Load() != before; got != c.invalidate {
			t.Errorf("%s: catalog invalidated %v, want %v", c.name, got, c.invalidate)
		}
	}
}

// TestTaintOnlyUpdateKeepsTheSnapshot: after a taint-only slice update the
// next pricing uses the same snapshot (no new pricer, no claim re-priced);
// after a device's capacity changes it does not.
func TestTaintOnlyUpdateKeepsTheSnapshot(t *testing.T) {
	ctx := context.Background()
	informers := &informertest.FakeInformers{Scheme: fakeScheme(t)}
	acct, _ := newAccountant(t, world(t)...)
	if err := Watch(ctx, informers, acct, NewNudger(nil, false)); err != nil {
		t.Fatal(err)
	}
	first, _, err := acct.snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inf := informerFor(t, informers, &resourceapi.ResourceSlice{})
	old := ourSlice()
	inf.Update(old, tainted(old))
	again, _, err := acct.snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Fatal("a taint-only slice update rebuilt the catalog: every claim is priced again")
	}
	inf.Update(old, withMemory(old, "40Gi"))
	rebuilt, _, err := acct.snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rebuilt == first {
		t.Fatal("a device's new capacity kept the old catalog")
	}
}

func catalogEvents(t *testing.T) []catalogEvent {
	slices := func(i *informertest.FakeInformers) *controllertest.FakeInformer {
		return informerFor(t, i, &resourceapi.ResourceSlice{})
	}
	profiles := func(i *informertest.FakeInformers) *controllertest.FakeInformer {
		return informerFor(t, i, &gpuaas.GpuProfile{})
	}
	classes := func(i *informertest.FakeInformers) *controllertest.FakeInformer {
		return informerFor(t, i, &resourceapi.DeviceClass{})
	}
	ours, theirs := ourSlice(), otherDriverSlice()
	republished := ours.DeepCopy()
	republished.ResourceVersion, republished.Generation = "2", 2
	profile := gpuProfile("h100", gpuaas.ProfileSelector{ProductName: "NVIDIA H100 80GB HBM3"})
	statusWrite := profile.DeepCopy()
	statusWrite.ResourceVersion = "2"
	statusWrite.Status.ObservedGeneration = 1
	respecced := statusWrite.DeepCopy()
	respecced.Generation = 2
	respecced.Spec.Selector.ProductName = "NVIDIA H200"
	deleting := profile.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	class := classOf(t, profile)
	rewritten := class.DeepCopy()
	rewritten.ResourceVersion = "2"
	unowned := class.DeepCopy()
	delete(unowned.Labels, gpuaas.ProfileLabel)
	reselected := class.DeepCopy()
	reselected.Spec.Selectors = nil
	return []catalogEvent{
		{"our slice added", func(i *informertest.FakeInformers) { slices(i).Add(ours) }, true},
		{"a device of ours tainted", func(i *informertest.FakeInformers) { slices(i).Update(ours, tainted(ours)) }, false},
		{"our slice republished unchanged", func(i *informertest.FakeInformers) { slices(i).Update(ours, republished) }, false},
		{"a device's capacity changed", func(i *informertest.FakeInformers) { slices(i).Update(ours, withMemory(ours, "40Gi")) }, true},
		{"a pool's new generation", func(i *informertest.FakeInformers) { slices(i).Update(ours, nextPoolGeneration(ours)) }, true},
		{"our slice deleted", func(i *informertest.FakeInformers) { slices(i).Delete(ours) }, true},
		{"another driver's slice added", func(i *informertest.FakeInformers) { slices(i).Add(theirs) }, false},
		{"another driver's slice updated", func(i *informertest.FakeInformers) { slices(i).Update(theirs, withMemory(theirs, "1Gi")) }, false},
		{"another driver's slice deleted", func(i *informertest.FakeInformers) { slices(i).Delete(theirs) }, false},
		{"a GpuProfile added", func(i *informertest.FakeInformers) { profiles(i).Add(profile) }, true},
		{"a GpuProfile's status written", func(i *informertest.FakeInformers) { profiles(i).Update(profile, statusWrite) }, false},
		{"a GpuProfile's spec changed", func(i *informertest.FakeInformers) { profiles(i).Update(statusWrite, respecced) }, true},
		{"a GpuProfile being deleted", func(i *informertest.FakeInformers) { profiles(i).Update(profile, deleting) }, true},
		{"a GpuProfile deleted", func(i *informertest.FakeInformers) { profiles(i).Delete(profile) }, true},
		{"a DeviceClass added", func(i *informertest.FakeInformers) { classes(i).Add(class) }, true},
		{"a DeviceClass rewritten unchanged", func(i *informertest.FakeInformers) { classes(i).Update(class, rewritten) }, false},
		{"a DeviceClass no longer a profile's", func(i *informertest.FakeInformers) { classes(i).Update(class, unowned) }, true},
		{"a DeviceClass's selectors changed", func(i *informertest.FakeInformers) { classes(i).Update(class, reselected) }, true},
		{"a DeviceClass deleted", func(i *informertest.FakeInformers) { classes(i).Delete(class) }, true},
	}
}

func informerFor(t *testing.T, i *informertest.FakeInformers, obj client.Object) *controllertest.FakeInformer {
	t.Helper()
	inf, err := i.FakeInformerFor(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	return inf
}

func ourSlice() *resourceapi.ResourceSlice {
	s := resourceSlice("node-a", testworld.WholeGPU(0), testworld.WholeGPU(1))
	s.ResourceVersion = "1"
	return s
}

func otherDriverSlice() *resourceapi.ResourceSlice {
	s := resourceSlice("node-a", testworld.WholeGPU(0))
	s.Name, s.Spec.Driver, s.ResourceVersion = "node-a-other", "gpu.example.com", "1"
	return s
}

func tainted(s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	out := s.DeepCopy()
	out.ResourceVersion = "2"
	out.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "gpu.gpuaas.io/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	return out
}

func withMemory(s *resourceapi.ResourceSlice, q string) *resourceapi.ResourceSlice {
	out := s.DeepCopy()
	out.ResourceVersion = "3"
	out.Spec.Devices[0].Capacity["memory"] = resourceapi.DeviceCapacity{Value: resource.MustParse(q)}
	return out
}

func nextPoolGeneration(s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	out := s.DeepCopy()
	out.ResourceVersion = "4"
	out.Spec.Pool.Generation++
	return out
}

func fakeScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPricesMovedFiltersAsTheCatalog: the TenantQuota reconciler's slice
// watch passes what invalidates the catalog and nothing else.
func TestPricesMovedFiltersAsTheCatalog(t *testing.T) {
	p := PricesMoved(&resourceapi.ResourceSlice{})
	ours, theirs := ourSlice(), otherDriverSlice()
	for _, c := range []struct {
		name string
		pass bool
		want bool
	}{
		{"our slice created", p.Create(event.CreateEvent{Object: ours}), true},
		{"another driver's slice created", p.Create(event.CreateEvent{Object: theirs}), false},
		{"a taint", p.Update(event.UpdateEvent{ObjectOld: ours, ObjectNew: tainted(ours)}), false},
		{"a capacity", p.Update(event.UpdateEvent{ObjectOld: ours, ObjectNew: withMemory(ours, "40Gi")}), true},
		{"another driver's update", p.Update(event.UpdateEvent{ObjectOld: theirs, ObjectNew: withMemory(theirs, "1Gi")}), false},
		{"our slice deleted", p.Delete(event.DeleteEvent{Object: ours}), true},
	} {
		if c.pass != c.want {
			t.Errorf("%s: passed %v, want %v", c.name, c.pass, c.want)
		}
	}
}

// TestProfileStatusWriteKeepsClaimPrices (issue 55, route 5): the profile
// reconciler writes a GpuProfile's status about a second after any
// allocation, so a tenant starting or stopping its own pod made the next
// admission of every tenant re-price every claim of its cohort, costly
// selectors included. A status write now leaves every cached charge valid.
func TestProfileStatusWriteKeepsClaimPrices(t *testing.T) {
	ctx := context.Background()
	informers := &informertest.FakeInformers{Scheme: fakeScheme(t)}
	c := claim("a", "held", "h100", 1)
	c.UID, c.ResourceVersion = "held-uid", "1"
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "4"), c)...)
	if err := Watch(ctx, informers, acct, NewNudger(nil, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := acct.Report(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	priced := acct.charges[c.UID]
	if priced.gen == 0 {
		t.Fatal("the claim was not priced")
	}
	profile := gpuProfile("h100", gpuaas.ProfileSelector{Type: "gpu"})
	written := profile.DeepCopy()
	written.ResourceVersion, written.Status.ObservedGeneration = "2", profile.Generation
	informerFor(t, informers, &gpuaas.GpuProfile{}).Update(profile, written)
	if _, err := acct.Report(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if again := acct.charges[c.UID]; again.gen != priced.gen {
		t.Fatalf("after a GpuProfile status write the claim was priced again (catalog generation %d -> %d)", priced.gen, again.gen)
	}
}
