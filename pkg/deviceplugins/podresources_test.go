package deviceplugins_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/deviceplugins"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceplugins/podresourcestest"
)

// TestReadNVIDIAResources reads the PodResources API over gRPC: NVIDIA's
// resources, advertised or held by a running pod, and nothing else.
func TestReadNVIDIAResources(t *testing.T) {
	srv := podresourcestest.Start(t)
	srv.SetAllocatable(
		podresourcestest.Devices("nvidia.com/gpu", "GPU-b", "GPU-a::1", "GPU-a::0"),
		podresourcestest.Devices("nvidia.com/mig-1g.10gb", "MIG-1"),
		podresourcestest.Devices("example.com/nic", "eth1"),
		podresourcestest.Devices("nvidia.com/gpu.shared"), // no device: left out
	)
	// A pod holds a device the plugin no longer advertises (removed, or
	// marked unhealthy): still in use through the device plugin.
	srv.SetPodDevices(podresourcestest.Devices("nvidia.com/gpu", "GPU-c", "GPU-b"))
	got, err := deviceplugins.Read(context.Background(), srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	want := []deviceplugins.Resource{
		{Name: "nvidia.com/gpu", IDs: []string{"GPU-a::0", "GPU-a::1", "GPU-b", "GPU-c"}},
		{Name: "nvidia.com/mig-1g.10gb", IDs: []string{"MIG-1"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Read = %+v, want %+v", got, want)
	}
}

func TestReadNothingAdvertised(t *testing.T) {
	srv := podresourcestest.Start(t)
	srv.SetAllocatable(podresourcestest.Devices("example.com/nic", "eth1"))
	got, err := deviceplugins.Read(context.Background(), srv.Socket)
	if err != nil || len(got) != 0 {
		t.Errorf("Read = %+v, %v; want nothing, no error", got, err)
	}
}

func TestReadWithoutSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	_, err := deviceplugins.Read(context.Background(), socket)
	if !errors.Is(err, deviceplugins.ErrNoSocket) || !strings.Contains(err.Error(), socket) {
		t.Errorf("Read without a socket: %v, want ErrNoSocket naming %s", err, socket)
	}
}

func TestReadFailingAPI(t *testing.T) {
	srv := podresourcestest.Start(t)
	srv.Fail(errors.New("kubelet busy"))
	_, err := deviceplugins.Read(context.Background(), srv.Socket)
	if err == nil || errors.Is(err, deviceplugins.ErrNoSocket) || !strings.Contains(err.Error(), "kubelet busy") {
		t.Errorf("Read from a failing API: %v, want its error", err)
	}
}

func TestIsNVIDIAResource(t *testing.T) {
	for name, want := range map[string]bool{
		"nvidia.com/gpu": true, "nvidia.com/gpu.shared": true, "nvidia.com/mig-1g.10gb": true,
		"nvidia.com/mig-3g.40gb.shared": true, "nvidia.com/gpus": false, "nvidia.com/hostdev": false,
		"gpu.gpuaas.io/gpu": false, "amd.com/gpu": false,
	} {
		if got := deviceplugins.IsNVIDIAResource(name); got != want {
			t.Errorf("IsNVIDIAResource(%q) = %v, want %v", name, got, want)
		}
	}
}
