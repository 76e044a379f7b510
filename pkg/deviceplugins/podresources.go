// Package deviceplugins finds out which of this node's NVIDIA GPUs a
// Kubernetes device plugin (NVIDIA's k8s-device-plugin, the GPU Operator's
// default) hands out, so that the DRA plugin does not publish the same GPUs
// to the scheduler a second time. It asks the kubelet, through its
// PodResources API, rather than looking for the device plugin's pod or
// socket: the kubelet's answer is what pods are actually given, whatever
// the device plugin's name, namespace or packaging.
package deviceplugins

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is the kubelet's PodResources socket under its default
// root directory (/var/lib/kubelet).
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// readTimeout bounds one read of the PodResources API: the kubelet answers
// from memory, so a slow answer means a kubelet in trouble, and the caller
// decides what an unanswered check means.
const readTimeout = 10 * time.Second

// maxMessageSize is the largest answer accepted: the kubelet's own limit
// for the PodResources API (a node with many pods answers List with more
// than gRPC's default 4 MiB).
const maxMessageSize = 16 << 20

// ErrNoSocket: there is no PodResources socket where one was expected.
// Usually the plugin's pod does not mount the kubelet's pod-resources
// directory, or the kubelet runs with another root directory.
var ErrNoSocket = errors.New("no kubelet PodResources socket")

// Resource is one extended resource of NVIDIA's device plugin on this node
// and the device IDs of it the kubelet reports: those advertised healthy
// (GetAllocatableResources) and those held by running pods (List), which
// include devices the device plugin no longer advertises (it was removed,
// or marks them unhealthy) while their pods still use them.
type Resource struct {
	Name string
	// IDs are sorted and unique.
	IDs []string
}

// IsNVIDIAResource reports whether an extended resource is one NVIDIA's
// device plugin advertises GPUs under: nvidia.com/gpu (whole GPUs, its
// time-slicing replicas, MIG devices with migStrategy single),
// nvidia.com/gpu.shared (replicas with renameByDefault) and
// nvidia.com/mig-<profile> (migStrategy mixed, ".shared" when renamed).
func IsNVIDIAResource(name string) bool {
	return name == "nvidia.com/gpu" || strings.HasPrefix(name, "nvidia.com/gpu.") ||
		strings.HasPrefix(name, "nvidia.com/mig-")
}

// Read asks the kubelet serving socket which NVIDIA device-plugin
// resources exist on the node and which device IDs they name, sorted by
// resource name. No resource at all is the answer "no device plugin hands
// out GPUs here". A socket that does not exist is ErrNoSocket.
func Read(ctx context.Context, socket string) ([]Resource, error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrNoSocket, socket, err)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageSize)))
	if err != nil {
		return nil, fmt.Errorf("connecting to the kubelet's PodResources API at %s: %w", socket, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("PodResources GetAllocatableResources at %s: %w", socket, err)
	}
	ids := map[string]map[string]bool{}
	add := func(devices []*podresourcesv1.ContainerDevices) {
		for _, d := range devices {
			if !IsNVIDIAResource(d.GetResourceName()) {
				continue
			}
			if ids[d.GetResourceName()] == nil {
				ids[d.GetResourceName()] = map[string]bool{}
			}
			for _, id := range d.GetDeviceIds() {
				ids[d.GetResourceName()][id] = true
			}
		}
	}
	add(alloc.GetDevices())
	list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("PodResources List at %s: %w", socket, err)
	}
	for _, pod := range list.GetPodResources() {
		for _, c := range pod.GetContainers() {
			add(c.GetDevices())
		}
	}
	out := make([]Resource, 0, len(ids))
	for name, set := range ids {
		r := Resource{Name: name}
		for id := range set {
			r.IDs = append(r.IDs, id)
		}
		slices.Sort(r.IDs)
		if len(r.IDs) > 0 {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
