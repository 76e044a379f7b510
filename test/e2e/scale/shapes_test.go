package scale

import (
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// nicDriver is another vendor's driver, whose NICs the benchmark publishes
// itself beside the fleet's GPUs: one per GPU, on the GPU's PCIe root.
const (
	nicDriver = "nic.scale.example.com"
	nicClass  = "scale-nic"
	nicLabel  = "scale.gpuaas.io/nics"
	pcieRoot  = "resource.kubernetes.io/pcieRoot"
)

// shapeModes are what issue 38 compares: one whole GPU per pod, and one
// instance of the slot shape per pod, a GPU and another driver's NIC on
// one PCIe root (the claim the GpuShape renders, its constraint
// included).
func shapeModes() []mode {
	slot := shape.ClaimSpec(&gpuaas.GpuShape{Spec: gpuaas.GpuShapeSpec{
		Requests:  []gpuaas.ShapeRequest{{Name: "gpu", Profile: "gpu.gpuaas.io"}, {Name: "nic", DeviceClassName: nicClass}},
		Alignment: gpuaas.AlignPCIeRoot,
	}})
	return []mode{
		{name: "whole-gpu", config: wholeConfig, claims: []resourceapi.DeviceRequest{exactly("gpu.gpuaas.io")}},
		{name: "shape-gpu-nic-one-pcie-root", config: wholeConfig, spec: &slot},
	}
}

// BenchmarkShapeScale measures the real kube-scheduler placing pods of the
// slot shape (GPU + NIC on one PCIe root, two drivers) against pods of one
// whole GPU, in one run, on $SCALE_NODES kwok nodes (default 100) of 8 x
// H100 with a NIC per GPU.
//
//	E2E_REQUIRED=1 go test ./test/e2e/scale -run '^$' -bench ShapeScale -benchtime 1x -v
func BenchmarkShapeScale(b *testing.B) {
	for _, n := range envInts(b, "SCALE_NODES", []int{100}) {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			r := startRunner(b, n, podsFor(b, n))
			publishNICs(b, r)
			results := r.runModes(b, shapeModes())
			b.Logf("%d nodes x 8 GPUs and 8 NICs, %d pods per mode:\n%s", n, r.pods, table(results))
		})
	}
}

// TestShapeScaleSmoke keeps BenchmarkShapeScale working at 8 nodes: every
// pod of the shape bound, its GPU and NIC allocated on its node, none
// twice.
func TestShapeScaleSmoke(t *testing.T) {
	const nodes = 8
	r := startRunner(t, nodes, 3*nodes)
	publishNICs(t, r)
	var results []result
	for _, m := range shapeModes() {
		results = append(results, r.run(t, m))
	}
	t.Logf("%d nodes, %d pods per mode (figures mean little at this size):\n%s", nodes, r.pods, table(results))
}

// publishNICs publishes, for every node of the fleet, a slice of another
// driver with one NIC on each GPU's PCIe root (read from the GPUs' own
// slices), and the NICs' DeviceClass; both go at cleanup.
func publishNICs(tb testing.TB, r *runner) {
	ctx := framework.Context(tb, 5*time.Minute)
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nicClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", nicDriver)}}}}}
	if _, err := r.client.ResourceV1().DeviceClasses().Create(ctx, class, createOpts); err != nil {
		tb.Fatalf("creating DeviceClass %s: %v", nicClass, err)
	}
	tb.Cleanup(func() {
		ctx := framework.Context(tb, time.Minute)
		_ = r.client.ResourceV1().DeviceClasses().Delete(ctx, nicClass, metav1.DeleteOptions{})
		_ = r.client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: nicLabel})
	})
	for _, node := range r.fleet.Names() {
		roots := gpuRoots(tb, r, node)
		var nics []resourceapi.Device
		for i, root := range roots {
			nics = append(nics, resourceapi.Device{Name: fmt.Sprintf("nic-%d", i),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{pcieRoot: {StringValue: ptr.To(root)}}})
		}
		slice := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: node + "-nics", Labels: map[string]string{nicLabel: "true"}},
			Spec: resourceapi.ResourceSliceSpec{Driver: nicDriver, NodeName: ptr.To(node),
				Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}, Devices: nics},
		}
		if _, err := r.client.ResourceV1().ResourceSlices().Create(ctx, slice, createOpts); err != nil {
			tb.Fatalf("publishing the NICs of %s: %v", node, err)
		}
	}
	time.Sleep(2 * time.Second) // the scheduler's informer, as configure waits
}

// gpuRoots are the PCIe roots of a node's GPUs, in the order published.
func gpuRoots(tb testing.TB, r *runner, node string) []string {
	ctx := framework.Context(tb, time.Minute)
	sel := fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", node), fields.OneTermEqualSelector("spec.driver", configapi.DriverName))
	list, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		tb.Fatalf("listing the slices of %s: %v", node, err)
	}
	var roots []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[pcieRoot]; ok && a.StringValue != nil {
				roots = append(roots, *a.StringValue)
			}
		}
	}
	if len(roots) == 0 {
		tb.Fatalf("node %s publishes no GPU with a %s", node, pcieRoot)
	}
	return roots
}
