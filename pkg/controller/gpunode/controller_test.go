package gpunode

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/kinds"
)

// Posture fixtures: whole GPUs with the attributes the plugin publishes
// (pkg/posture's own tests cover every mode from the plugin's slices).

func postureGPU(index int64) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-%d", index),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": attr("gpu"), "index": intAttr(index), "uuid": attr(fmt.Sprintf("GPU-%d", index)),
			"productName": attr("NVIDIA H100 80GB HBM3"),
		},
	}
}

func postureSlice(node string, gpus int) *resourceapi.ResourceSlice {
	var devices []resourceapi.Device
	for i := range gpus {
		devices = append(devices, postureGPU(int64(i)))
	}
	s := resourceSlice(node, devices...)
	s.Name = node + "-gpu.gpuaas.io"
	return s
}

func drainRule(name string, sel *resourceapi.DeviceTaintSelector) *resourceapi.DeviceTaintRule {
	return &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: sel,
			Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Value: "kernel", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
}

func newPostureClient(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithIndex(&resourceapi.ResourceSlice{}, indexSlicePool, slicePoolIndex).
		WithIndex(&resourceapi.ResourceClaim{}, indexClaimPools, claimPoolsIndex).
		WithStatusSubresource(&gpuaas.GpuNode{}).
		Build()
}

type postureClock struct{ now time.Time }

func (c *postureClock) Now() time.Time { return c.now }

func newPostureReconciler(c client.Client, rules bool, clock *postureClock) *postureReconciler {
	registerPostureMetrics()
	return &postureReconciler{client: c, rules: rules, resync: time.Minute, now: clock.Now, metrics: newPostureMetrics()}
}

func reconcileNode(t *testing.T, r *postureReconciler, node string) {
	t.Helper()
	if _, err := r.Reconcile(ctx(t), reconcile.Request{NamespacedName: client.ObjectKey{Name: node}}); err != nil {
		t.Fatalf("reconcile %s: %v", node, err)
	}
}

func getGpuNode(t *testing.T, c client.Client, node string) *gpuaas.GpuNode {
	t.Helper()
	var gn gpuaas.GpuNode
	err := c.Get(ctx(t), client.ObjectKey{Name: node}, &gn)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &gn
}

// postureSeries are a node's gpuaas_gpu_posture series as "gpu/posture=value".
func postureSeries(t *testing.T, node string) []string {
	t.Helper()
	return collectSeries(t, gpuPostureGauge, node, func(l map[string]string) string { return l["gpu"] + "/" + l["posture"] })
}

func nodePostureSeries(t *testing.T, node string) []string {
	t.Helper()
	return collectSeries(t, nodePostureGauge, node, func(l map[string]string) string { return l["posture"] })
}

func collectSeries(t *testing.T, g *prometheus.GaugeVec, node string, key func(map[string]string) string) []string {
	t.Helper()
	ch := make(chan prometheus.Metric, 1000)
	g.Collect(ch)
	close(ch)
	var out []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["node"] == node {
			out = append(out, fmt.Sprintf("%s=%g", key(labels), pb.GetGauge().GetValue()))
		}
	}
	slices.Sort(out)
	return out
}

func TestPostureReconcilerCreatesGpuNode(t *testing.T) {
	const node = "posture-create"
	c := newPostureClient(t,
		postureSlice(node, 4),
		allocatedTo(claim("team-a", "train", "h100", 1), node, "gpu-1"),
		drainRule("maint", &resourceapi.DeviceTaintSelector{Pool: ptr.To(node), Device: ptr.To("gpu-3")}),
	)
	clock := &postureClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	reconcileNode(t, newPostureReconciler(c, true, clock), node)

	gn := getGpuNode(t, c, node)
	if gn == nil {
		t.Fatal("no GpuNode created")
	}
	s := gn.Status
	if s.Posture != gpuaas.PostureDegraded || !strings.HasPrefix(s.Reason, "4 GPUs: 2 Available, 1 AllocatedWhole, 1 Draining; GPU 3 Draining: DeviceTaintRule maint") {
		t.Errorf("node posture %s %q", s.Posture, s.Reason)
	}
	want := gpuaas.PostureSummary{GPUs: 4, Available: 2, AllocatedWhole: 1, Allocated: 1, Draining: 1}
	if s.Summary != want {
		t.Errorf("summary = %+v, want %+v", s.Summary, want)
	}
	if s.ObservedTime == nil || !s.ObservedTime.Time.Equal(clock.now) {
		t.Errorf("observedTime = %v, want %v", s.ObservedTime, clock.now)
	}
	g := s.GPUs[1]
	if g.Index != 1 || g.UUID != "GPU-1" || g.Mode != gpuaas.GpuModeWhole || g.Posture != gpuaas.PostureAllocatedWhole ||
		g.Reason != "whole GPU gpu-1 allocated to team-a/train" || !slices.Equal(g.Claims, []string{"team-a/train"}) {
		t.Errorf("GPU 1 = %+v", g)
	}
	if got, want := postureSeries(t, node), []string{"0/Available=1", "1/AllocatedWhole=1", "2/Available=1", "3/Draining=1"}; !slices.Equal(got, want) {
		t.Errorf("gpuaas_gpu_posture = %v, want %v", got, want)
	}
	if got := nodePostureSeries(t, node); !slices.Equal(got, []string{"Degraded=1"}) {
		t.Errorf("gpuaas_node_posture = %v", got)
	}
}

func TestPostureReconcilerWritesOnlyChanges(t *testing.T) {
	const node = "posture-changes"
	train := allocatedTo(claim("team-a", "train", "h100", 1), node, "gpu-1")
	c := newPostureClient(t, postureSlice(node, 2), train)
	clock := &postureClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	r := newPostureReconciler(c, true, clock)
	reconcileNode(t, r, node)
	first := getGpuNode(t, c, node)

	clock.now = clock.now.Add(time.Minute)
	reconcileNode(t, r, node)
	if again := getGpuNode(t, c, node); again.ResourceVersion != first.ResourceVersion {
		t.Errorf("unchanged posture rewritten: resourceVersion %s -> %s", first.ResourceVersion, again.ResourceVersion)
	}

	// The claim gives its GPU back.
	var live resourceapi.ResourceClaim
	if err := c.Get(ctx(t), client.ObjectKeyFromObject(train), &live); err != nil {
		t.Fatal(err)
	}
	live.Status.Allocation = nil
	// The fake client has no status subresource for claims: Update
	// writes the status.
	if err := c.Update(ctx(t), &live); err != nil {
		t.Fatal(err)
	}
	reconcileNode(t, r, node)
	after := getGpuNode(t, c, node)
	if after.Status.Posture != gpuaas.PostureAvailable || after.Status.GPUs[1].Posture != gpuaas.PostureAvailable {
		t.Errorf("after release: node %s, GPU 1 %s", after.Status.Posture, after.Status.GPUs[1].Posture)
	}
	if !after.Status.ObservedTime.Time.Equal(clock.now) {
		t.Errorf("observedTime %v did not move to the change at %v", after.Status.ObservedTime, clock.now)
	}
	if got, want := postureSeries(t, node), []string{"0/Available=1", "1/Available=1"}; !slices.Equal(got, want) {
		t.Errorf("gpuaas_gpu_posture = %v, want %v (the AllocatedWhole series must go)", got, want)
	}
	if got := nodePostureSeries(t, node); !slices.Equal(got, []string{"Available=1"}) {
		t.Errorf("gpuaas_node_posture = %v", got)
	}
}

func TestPostureReconcilerRestoresEditedStatus(t *testing.T) {
	const node = "posture-edited"
	c := newPostureClient(t, postureSlice(node, 1))
	r := newPostureReconciler(c, true, &postureClock{now: time.Now()})
	reconcileNode(t, r, node)
	gn := getGpuNode(t, c, node)
	gn.Status.Posture = gpuaas.PostureUnhealthy
	if err := c.Status().Update(ctx(t), gn); err != nil {
		t.Fatal(err)
	}
	reconcileNode(t, r, node)
	if got := getGpuNode(t, c, node).Status.Posture; got != gpuaas.PostureAvailable {
		t.Errorf("edited posture kept: %s", got)
	}
}

func TestPostureReconcilerDeletesGpuNodeWithoutSlices(t *testing.T) {
	const node = "posture-gone"
	slice := postureSlice(node, 2)
	stale := &gpuaas.GpuNode{ObjectMeta: metav1.ObjectMeta{Name: "posture-never-published"}}
	c := newPostureClient(t, slice, stale)
	r := newPostureReconciler(c, true, &postureClock{now: time.Now()})
	reconcileNode(t, r, node)
	if getGpuNode(t, c, node) == nil || len(postureSeries(t, node)) != 2 {
		t.Fatal("GpuNode or metrics not created")
	}
	if err := c.Delete(ctx(t), slice); err != nil {
		t.Fatal(err)
	}
	reconcileNode(t, r, node)
	if getGpuNode(t, c, node) != nil {
		t.Error("GpuNode of a node that publishes nothing kept")
	}
	if got := append(postureSeries(t, node), nodePostureSeries(t, node)...); len(got) != 0 {
		t.Errorf("metrics of a node that publishes nothing kept: %v", got)
	}
	reconcileNode(t, r, stale.Name)
	if getGpuNode(t, c, stale.Name) != nil {
		t.Error("GpuNode of a node that never published kept")
	}
}

func TestPostureReconcilerEmptyPool(t *testing.T) {
	const node = "posture-empty"
	c := newPostureClient(t, resourceSlice(node)) // "driver up, no devices"
	reconcileNode(t, newPostureReconciler(c, true, &postureClock{now: time.Now()}), node)
	gn := getGpuNode(t, c, node)
	if gn == nil || gn.Status.Posture != gpuaas.PostureEmpty || gn.Status.Summary.GPUs != 0 {
		t.Fatalf("GpuNode = %+v", gn)
	}
}

func TestPostureReconcilerWithoutDeviceTaintRules(t *testing.T) {
	const node = "posture-no-rules"
	c := newPostureClient(t, postureSlice(node, 1), drainRule("maint", &resourceapi.DeviceTaintSelector{}))
	reconcileNode(t, newPostureReconciler(c, false, &postureClock{now: time.Now()}), node)
	if got := getGpuNode(t, c, node).Status.GPUs[0].Posture; got != gpuaas.PostureAvailable {
		t.Errorf("GPU 0 %s on a cluster said not to serve DeviceTaintRules", got)
	}
	reconcileNode(t, newPostureReconciler(c, true, &postureClock{now: time.Now()}), node)
	if got := getGpuNode(t, c, node).Status.GPUs[0].Posture; got != gpuaas.PostureDraining {
		t.Errorf("GPU 0 %s under a rule for every device", got)
	}
}

func TestPostureMapsObjectsToNodes(t *testing.T) {
	foreign := postureSlice("nic-node", 1)
	foreign.Spec.Driver = "nic.example.com"
	c := newPostureClient(t, postureSlice("node-1", 1), postureSlice("node-2", 1), foreign)
	multi := allocatedTo(claim("team-a", "multi", "h100", 1), "node-2", "gpu-0")
	multi.Status.Allocation.Devices.Results = append(multi.Status.Allocation.Devices.Results,
		resourceapi.DeviceRequestAllocationResult{Driver: driver, Pool: "node-1", Device: "gpu-0"},
		resourceapi.DeviceRequestAllocationResult{Driver: driver, Pool: "node-2", Device: "gpu-1"},
		resourceapi.DeviceRequestAllocationResult{Driver: "nic.example.com", Pool: "nic-node", Device: "nic-0"})
	rules := rulePools(c)
	for name, tc := range map[string]struct {
		got  []string
		want []string
	}{
		"our slice":                {slicePools(ctx(t), postureSlice("node-1", 1)), []string{"node-1"}},
		"another driver's slice":   {slicePools(ctx(t), foreign), nil},
		"claim on two nodes":       {claimPools(ctx(t), multi), []string{"node-1", "node-2"}},
		"unallocated claim":        {claimPools(ctx(t), claim("team-a", "pending", "h100", 1)), nil},
		"rule on a pool":           {rules(ctx(t), drainRule("r", &resourceapi.DeviceTaintSelector{Pool: ptr.To("node-2")})), []string{"node-2"}},
		"rule on every pool":       {rules(ctx(t), drainRule("r", &resourceapi.DeviceTaintSelector{Device: ptr.To("gpu-0")})), []string{"node-1", "node-2"}},
		"rule of another driver":   {rules(ctx(t), drainRule("r", &resourceapi.DeviceTaintSelector{Driver: ptr.To("nic.example.com")})), nil},
		"rule without a selector":  {rules(ctx(t), drainRule("r", nil)), nil},
		"rule naming our driver":   {rules(ctx(t), drainRule("r", &resourceapi.DeviceTaintSelector{Driver: ptr.To(driver)})), []string{"node-1", "node-2"}},
		"not a rule":               {rules(ctx(t), postureSlice("node-1", 1)), nil},
		"claim index of non-claim": {claimPoolsIndex(postureSlice("node-1", 1)), nil},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s: %v, want %v", name, tc.got, tc.want)
		}
	}
}

// recordingQueue records what nodeEvents enqueues.
type recordingQueue struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	added []string
}

func (q *recordingQueue) AddAfter(r reconcile.Request, _ time.Duration) {
	q.added = append(q.added, r.Name)
}

func TestPostureEventsEnqueueOldAndNewNodes(t *testing.T) {
	old := allocatedTo(claim("team-a", "moved", "h100", 1), "node-1", "gpu-0")
	moved := old.DeepCopy()
	moved.Status.Allocation.Devices.Results[0].Pool = "node-2"
	q := &recordingQueue{}
	nodeEvents(claimPools).Update(ctx(t), event.UpdateEvent{ObjectOld: old, ObjectNew: moved}, q)
	if !slices.Equal(q.added, []string{"node-1", "node-2"}) {
		t.Errorf("enqueued %v, want the node left and the node reached", q.added)
	}

	released := old.DeepCopy()
	released.Status.Allocation = nil
	reservedOnly := old.DeepCopy()
	reservedOnly.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "u"}}
	for name, tc := range map[string]struct {
		newObj *resourceapi.ResourceClaim
		want   bool
	}{
		"released":          {released, true},
		"moved":             {moved, true},
		"only reservedFor":  {reservedOnly, false},
		"nothing different": {old.DeepCopy(), false},
	} {
		if got := allocationChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: tc.newObj}); got != tc.want {
			t.Errorf("%s: allocationChanged = %v, want %v", name, got, tc.want)
		}
	}
}

func TestPostureSetupFindsWhatTheAPIServes(t *testing.T) {
	m := meta.NewDefaultRESTMapper(nil)
	m.Add(gpuaas.GroupVersion.WithKind(gpuaas.GpuNodeKind), meta.RESTScopeRoot)
	if ok, err := servesGpuNodes(ctx(t), m); !ok || err != nil {
		t.Errorf("GpuNodes served = %v, %v", ok, err)
	}
	rules := schema.GroupKind{Group: resourceapi.GroupName, Kind: "DeviceTaintRule"}
	if ok, err := kinds.Served(m, rules, "v1"); ok || err != nil {
		t.Errorf("DeviceTaintRules on a cluster without them: served = %v, %v", ok, err)
	}
	m.Add(resourceapi.SchemeGroupVersion.WithKind("DeviceTaintRule"), meta.RESTScopeRoot)
	if ok, err := kinds.Served(m, rules, "v1"); !ok || err != nil {
		t.Errorf("DeviceTaintRules served = %v, %v", ok, err)
	}
}
