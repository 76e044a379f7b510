package nicdriver

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// TestPrepareWritesNICEnv: a claim of one of our GPUs and a NIC gets a CDI
// device for the NIC alone, whose spec sets NIC_<DEVICE> to the NIC's
// root; unprepare removes the spec, twice without error.
func TestPrepareWritesNICEnv(t *testing.T) {
	d := &Driver{cdiRoot: t.TempDir(), roots: map[string]string{"eth-0": "pci0000:37"}}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "slot", UID: "uid-1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: "gpu.gpuaas.io", Pool: "n", Device: "gpu-1"},
				{Request: "nic", Driver: DriverName, Pool: "n", Device: "eth-0"},
			}}}},
	}
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil || got["uid-1"].Err != nil {
		t.Fatalf("prepare: %v %v", err, got["uid-1"].Err)
	}
	devs := got["uid-1"].Devices
	if len(devs) != 1 || devs[0].DeviceName != "eth-0" || len(devs[0].CDIDeviceIDs) != 1 || devs[0].CDIDeviceIDs[0] != "example.com/nic=uid-1-eth-0" {
		t.Fatalf("prepared devices %+v, want eth-0 alone as example.com/nic=uid-1-eth-0", devs)
	}
	data, err := os.ReadFile(d.specPath("uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.Devices) != 1 || len(spec.Devices[0].ContainerEdits.Env) != 1 || spec.Devices[0].ContainerEdits.Env[0] != "NIC_ETH_0=pci0000:37" {
		t.Fatalf("CDI spec %s, want one device setting NIC_ETH_0=pci0000:37", data)
	}
	for range 2 {
		res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: types.UID("uid-1")}})
		if err != nil || res["uid-1"] != nil {
			t.Fatalf("unprepare: %v %v", err, res["uid-1"])
		}
	}
	if _, err := os.Stat(d.specPath("uid-1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the CDI spec is still there after unprepare: %v", err)
	}
}

// TestPrepareRefusesForeignNIC: a NIC this node does not have fails the
// claim rather than handing a container nothing.
func TestPrepareRefusesForeignNIC(t *testing.T) {
	d := &Driver{cdiRoot: t.TempDir(), roots: map[string]string{}}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "slot", UID: "uid-2"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: DriverName, Pool: "n", Device: "eth9"}}}}},
	}
	got, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil || got["uid-2"].Err == nil {
		t.Fatalf("prepare of an unknown NIC: %v, claim error %v; want a claim error", err, got["uid-2"].Err)
	}
}
