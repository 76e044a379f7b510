package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/nicdriver"
)

// noGPURoot is a PCIe root none of the mock GPUs sits on (theirs are
// pci0000:17, 37, ..., f7): a NIC there can never make a slot.
const noGPURoot = "pci0000:e0"

// TestShapeGPUNICSlot runs another vendor's DRA driver (the NIC double of
// test/nicdriver, on the same kubelet) beside the chart on the real node:
// one NIC on GPU 1's PCIe root and one on a root without a GPU. It applies
// demo/shapes/gpu-nic-slot.yaml: while the NIC DeviceClass is missing the
// shape's Ready condition names it; with it, the shape counts 1 placeable,
// the pod of the shape runs, and its container sees a GPU from our CDI spec
// and a NIC from the double's, on one root (compared in the container's
// own environment); then nothing is placeable and a second pod's claim is
// refused (whenUnavailable: Refuse).
func TestShapeGPUNICSlot(t *testing.T) {
	requireRealNode(t)
	// The in-process mock: a GPU's PCIe root comes from sysfs on the real
	// NVML path (deviceattribute reads /sys/bus/pci), where the simulated
	// GPUs have none; the mock derives one per GPU.
	n := startRealNode(t, onInProcessMock)
	installChartForTest(t, n)
	installCRDs(t) // the typed client of waitForShape; the chart's CRDs are the same
	ctx := framework.Context(t, 6*time.Minute)
	gpuRoot := gpuRootOf(t, ctx, n, 1)
	startNICDriver(t, n, []nicdriver.NIC{{Name: "eth0", PCIeRoot: gpuRoot}, {Name: "eth1", PCIeRoot: noGPURoot}})

	file := filepath.Join(repoRoot, "demo", "shapes", "gpu-nic-slot.yaml")
	objs := readWorkloadSpec(t, file)
	var nicClass, pod []*unstructured.Unstructured
	var rest []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "DeviceClass":
			nicClass = append(nicClass, o)
		case "Pod":
			pod = append(pod, o)
		default:
			rest = append(rest, o)
		}
		if o.GetNamespace() == "" && o.GetKind() != "Namespace" {
			deleteAtCleanup(t, o)
		}
	}
	const ns, shape = "shapes-slot", "h100-nic-slot"
	cp.DeleteNamespaceAtCleanup(t, ns)
	applyAll(t, ctx, file, rest)
	waitForShape(t, shape, "naming its missing NIC class", func(s *gpuaas.GpuShape) bool {
		c := findCondition(s.Status.Conditions, gpuaas.ConditionReady)
		return c != nil && c.Reason == gpuaas.ReasonPartsMissing && c.Message == `request nic: DeviceClass "slot-nic" does not exist`
	})
	applyAll(t, ctx, file, nicClass)
	s := waitForShape(t, shape, "ready with one slot", func(s *gpuaas.GpuShape) bool {
		c := findCondition(s.Status.Conditions, gpuaas.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && s.Status.Templates == 1 && s.Status.Placeable == 1
	})
	t.Logf("shape %s: placeable %d (%s)", shape, s.Status.Placeable, s.Status.PlaceableMessage)
	applyAll(t, ctx, file, pod)

	worker := runningPod(t, ctx, ns, "worker")
	claims := podClaims(t, ctx, worker)
	if len(claims) != 1 || claims[0].Status.Allocation == nil {
		t.Fatalf("the slot's claims: %+v", claims)
	}
	var nic string
	for _, r := range claims[0].Status.Allocation.Devices.Results {
		if r.Driver == nicdriver.DriverName {
			nic = r.Device
		}
	}
	if nic != "eth0" {
		t.Fatalf("the slot got NIC %q, want eth0, the one on a GPU's root; allocation %+v", nic, claims[0].Status.Allocation.Devices.Results)
	}
	checkSlotContainer(t, ctx, n, worker, nic)
	waitForShape(t, shape, "placeable 0 with the slot taken", func(s *gpuaas.GpuShape) bool {
		return s.Status.Placeable == 0 && s.Status.PlaceableMessage == "0 of 1 nodes have a free GPU+NIC on one PCIe root"
	})

	// whenUnavailable: Refuse: a second pod's claim is refused, and the pod
	// is told why.
	second := worker.DeepCopy()
	second.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: "second-worker"}
	second.Status = v1.PodStatus{}
	second.Spec.NodeName = ""
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitShapeUnavailable(t, ctx, ns, "second-worker", "unavailable: shape h100-nic-slot has 0 placeable (0 of 1 nodes have a free GPU+NIC on one PCIe root)")
}

// checkSlotContainer reads what the slot's container saw: exactly one GPU
// (GPUAAS_DEVICE_*) and the NIC's variable, whose root is the GPU's root as
// published by our plugin.
func checkSlotContainer(t *testing.T, ctx context.Context, n *realNode, pod *v1.Pod, nic string) {
	t.Helper()
	log, err := n.WaitForPodLog(ctx, pod.Namespace, pod.Name, pod.Spec.Containers[0].Name, "gpuinfo done")
	if err != nil {
		t.Fatal(err)
	}
	uuids, _ := parseGPUInfo(log)
	if uuids.Len() != 1 {
		t.Fatalf("the container sees GPUs %v, want one\n%s", uuids.UnsortedList(), log)
	}
	gpu := deviceWithUUID(t, ctx, n, uuids.UnsortedList()[0])
	gpuRoot := stringAttr(gpu, "resource.kubernetes.io/pcieRoot")
	var nicRoot string
	for _, line := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(line, "env "+nicdriver.EnvVar(nic)+"="); ok {
			nicRoot = v
		}
	}
	if nicRoot == "" || nicRoot != gpuRoot {
		t.Fatalf("the container sees GPU %s on root %q and NIC %s on root %q, want both on one root\n%s", gpu.Name, gpuRoot, nic, nicRoot, log)
	}
	t.Logf("the container sees GPU %s and NIC %s, both on %s", gpu.Name, nic, gpuRoot)
}

// gpuRootOf is the PCIe root our plugin publishes for the whole GPU of
// index on n.
func gpuRootOf(t *testing.T, ctx context.Context, n *realNode, index int64) string {
	t.Helper()
	devices, err := cp.PoolDevices(ctx, n.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		if i, ok := intAttr(d, "index"); ok && i == index && stringAttr(d, "type") == "gpu" {
			if root := stringAttr(d, "resource.kubernetes.io/pcieRoot"); root != "" {
				return root
			}
		}
	}
	t.Fatalf("no whole GPU of index %d with a pcieRoot among %d devices of %s", index, len(devices), n.Name)
	return ""
}

// deviceWithUUID is our published device with the given uuid.
func deviceWithUUID(t *testing.T, ctx context.Context, n *realNode, uuid string) resourceapi.Device {
	t.Helper()
	devices, err := cp.PoolDevices(ctx, n.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		if stringAttr(d, "uuid") == uuid && stringAttr(d, "type") == "gpu" {
			return d
		}
	}
	t.Fatalf("no whole GPU with uuid %s on %s", uuid, n.Name)
	return resourceapi.Device{}
}

// startNICDriver runs the NIC double on n's kubelet until the test ends,
// then deletes its slices (a stopped driver leaves them, as any does).
func startNICDriver(t *testing.T, n *realNode, nics []nicdriver.NIC) {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().WithName("nicdriver")))
	d, err := nicdriver.Start(ctx, nicdriver.Options{Client: cp.Client, NodeName: n.Name, KubeletDir: n.KubeletDir, CDIRoot: n.CDIRoot, NICs: nics})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		cancel()
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		err := cp.Client.ResourceV1().ResourceSlices().DeleteCollection(dctx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + nicdriver.DriverName})
		if err != nil {
			t.Errorf("deleting the NIC double's slices: %v", err)
		}
	})
	err = waitNICsPublished(ctx, n.Name, len(nics))
	if err != nil {
		t.Fatal(err)
	}
}

// waitNICsPublished waits until the double's pool on node lists want NICs.
func waitNICsPublished(ctx context.Context, node string, want int) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var got int
	err := wait.PollUntilContextCancel(wctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + nicdriver.DriverName + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + node})
		if err != nil {
			return false, nil // the timeout decides
		}
		got = 0
		for _, s := range list.Items {
			got += len(s.Spec.Devices)
		}
		return got == want, nil
	})
	if err != nil {
		return fmt.Errorf("the NIC double published %d NICs on %s, want %d: %w", got, node, want, err)
	}
	return nil
}

// applyAll applies objects of file (none without a namespace but
// cluster-scoped ones).
func applyAll(t *testing.T, ctx context.Context, file string, objs []*unstructured.Unstructured) {
	t.Helper()
	if _, _, err := cp.ApplyObjects(ctx, file, objs, ""); err != nil {
		t.Fatal(err)
	}
}
