package admission

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// TestWatchShapesInvalidatesOnSpecChangesOnly: once WatchShapes runs, the
// accountant counts shape instances, and a shape added, deleted or given a
// new spec (generation) makes it price claims again; a status write (the
// placeable count, about every second) does not, so it does not throw away
// every claim's cached price that often.
func TestWatchShapesInvalidatesOnSpecChangesOnly(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := gpuaas.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	informers := &informertest.FakeInformers{Scheme: scheme}
	acct := &Accountant{}
	ctx := context.Background()
	if err := WatchShapes(ctx, informers, acct); err != nil {
		t.Fatal(err)
	}
	if !acct.countShapes.Load() {
		t.Fatal("after WatchShapes the accountant does not count shape instances")
	}
	inf, err := informers.FakeInformerFor(ctx, &gpuaas.GpuShape{})
	if err != nil {
		t.Fatal(err)
	}
	old := slotShape()
	statusOnly := old.DeepCopy()
	statusOnly.Status.Placeable = 3
	newSpec := old.DeepCopy()
	newSpec.Generation++
	newSpec.Spec.Alignment = gpuaas.AlignNone
	for _, c := range []struct {
		name       string
		event      func()
		invalidate bool
	}{
		{"add", func() { inf.Add(old) }, true},
		{"status write", func() { inf.Update(old, statusOnly) }, false},
		{"spec change", func() { inf.Update(statusOnly, newSpec) }, true},
		{"delete", func() { inf.Delete(newSpec) }, true},
	} {
		before := acct.catalogGen.Load()
		c.event()
		if got := acct.catalogGen.Load() != before; got != c.invalidate {
			t.Errorf("%s: catalog invalidated %v, want %v", c.name, got, c.invalidate)
		}
	}
}
