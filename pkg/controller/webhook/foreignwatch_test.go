package webhook

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// TestWatchForeignClassesSkipsWhatMovesNoPrice (issue 52): the leader's
// matchCondition sync, and the catalog it re-prices with, follow only the
// slice and class changes that can change a class's foreignness. A health
// taint on one of our devices, or any change to another driver's slices,
// invalidated the catalog and queued a sync of every class before.
func TestWatchForeignClassesSkipsWhatMovesNoPrice(t *testing.T) {
	scheme, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	informers := &informertest.FakeInformers{Scheme: scheme}
	var invalidated int
	s := NewMatchConditionSyncer(nil, nil, "", 0)
	if err := WatchForeignClasses(context.Background(), informers, func() { invalidated++ }, s); err != nil {
		t.Fatal(err)
	}
	inf, err := informers.FakeInformerFor(context.Background(), &resourceapi.ResourceSlice{})
	if err != nil {
		t.Fatal(err)
	}
	ours := testworld.ResourceSlice("node-a", testworld.WholeGPU(0))
	theirs := ours.DeepCopy()
	theirs.Name, theirs.Spec.Driver = "nic", "nic.example.com"
	taint := ours.DeepCopy()
	taint.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	moreDevices := theirs.DeepCopy()
	moreDevices.Spec.Devices = append(moreDevices.Spec.Devices, testworld.WholeGPU(1))
	inf.Update(ours, taint)
	inf.Add(theirs)
	inf.Update(theirs, moreDevices)
	inf.Delete(theirs)
	if invalidated != 0 || len(s.kick) != 0 {
		t.Fatalf("a taint and another driver's slices: catalog invalidated %d times, sync queued %v; want neither", invalidated, len(s.kick) != 0)
	}
	grown := ours.DeepCopy()
	grown.Spec.Devices = append(grown.Spec.Devices, testworld.WholeGPU(1))
	inf.Update(ours, grown)
	if invalidated != 1 || len(s.kick) != 1 {
		t.Fatalf("a new device of ours: catalog invalidated %d times, sync queued %v; want once, queued", invalidated, len(s.kick) != 0)
	}
	profiles, err := informers.FakeInformerFor(context.Background(), &gpuaas.GpuProfile{})
	if err != nil {
		t.Fatal(err)
	}
	p := testworld.GpuProfile("h100", gpuaas.ProfileSelector{ProductName: "H100"})
	written := p.DeepCopy()
	written.Status.ObservedGeneration = p.Generation
	<-s.kick
	profiles.Update(p, written)
	if invalidated != 1 || len(s.kick) != 0 {
		t.Fatalf("a GpuProfile status write: catalog invalidated %d times in all, sync queued %v; want no more", invalidated, len(s.kick) != 0)
	}
}
