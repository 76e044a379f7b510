package preparetest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/pkg/cdi"
)

// ClaimBuilder makes allocated claims the way the scheduler leaves them.
type ClaimBuilder struct{ claim *resourceapi.ResourceClaim }

// NewClaim starts a claim with uid, allocated and reserved for a pod.
func NewClaim(uid string) *ClaimBuilder {
	return &ClaimBuilder{claim: &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "claim-" + uid, UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "pod-" + types.UID(uid)}},
		},
	}}
}

// Device allocates the device name for request.
func (b *ClaimBuilder) Device(request, name string) *ClaimBuilder {
	return b.Result(resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: configapi.DriverName, Pool: Node, Device: name,
	})
}

// AdminDevice allocates the device name for request with admin access.
func (b *ClaimBuilder) AdminDevice(request, name string) *ClaimBuilder {
	return b.Result(resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: configapi.DriverName, Pool: Node, Device: name, AdminAccess: ptr.To(true),
	})
}

// Result adds an allocation result.
func (b *ClaimBuilder) Result(r resourceapi.DeviceRequestAllocationResult) *ClaimBuilder {
	a := b.claim.Status.Allocation
	a.Devices.Results = append(a.Devices.Results, r)
	return b
}

// Config adds opaque configuration (raw JSON) from source for requests.
func (b *ClaimBuilder) Config(source resourceapi.AllocationConfigSource, raw string, requests ...string) *ClaimBuilder {
	a := b.claim.Status.Allocation
	a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: configapi.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)},
		}},
	})
	return b
}

// Build is the claim.
func (b *ClaimBuilder) Build() *resourceapi.ResourceClaim { return b.claim }

// DynamicAll offers every GPU as dynamic MIG.
func DynamicAll() *configapi.NodeConfig {
	return &configapi.NodeConfig{Default: configapi.GpuMode{MIG: configapi.MigDynamic}}
}

// MinorsFile fakes /proc/driver/nvidia-caps/mig-minors for a few GPUs.
func MinorsFile(gpus int) string {
	var b strings.Builder
	minor := 1
	for g := range gpus {
		for gi := range 8 {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, minor)
			minor++
			for ci := range 8 {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, minor)
				minor++
			}
		}
	}
	return b.String()
}

// FastInUseRetry waits as mig.DefaultInUseRetry does, in less time.
var FastInUseRetry = mig.InUseRetry{Within: 300 * time.Millisecond, First: 5 * time.Millisecond}

// GPUNodePath matches a GPU's device node, its minor the submatch.
var GPUNodePath = regexp.MustCompile(`^/dev/nvidia([0-9]+)$`)

// ReadClaimSpec reads a claim's CDI spec.
func ReadClaimSpec(t *testing.T, e *Env, uid string) *cdispec.Spec {
	t.Helper()
	spec, err := cdispec.ReadSpec(cdi.SpecPath(e.CDIRoot, uid), 0)
	if err != nil {
		t.Fatalf("reading the CDI spec of %s: %v", uid, err)
	}
	return spec
}

// Restorer is what Restore restores: a State.
type Restorer interface {
	Restore(ctx context.Context, client kubernetes.Interface, inv inventory.Inventory, register func(context.Context) error) (inventory.Inventory, error)
}

// Restore runs s's Restore as Start does (without a kubelet to register
// with), on the env's inventory, with apiClaims in the API.
func Restore(t *testing.T, e *Env, s Restorer, apiClaims ...*resourceapi.ResourceClaim) {
	objs := make([]runtime.Object, 0, len(apiClaims))
	for _, c := range apiClaims {
		objs = append(objs, c)
	}
	if _, err := s.Restore(e.Ctx, fake.NewClientset(objs...), e.Inventory, nil); err != nil {
		t.Error(err)
	}
}

// SchedulerFeatures are the allocator features of a v1.37 scheduler with
// the gates the e2e cluster runs (partitionable devices, consumable
// capacity, prioritized lists, device taints).
var SchedulerFeatures = structured.Features{
	AdminAccess: true, ConsumableCapacity: true, DeviceTaints: true,
	PartitionableDevices: true, PrioritizedList: true,
}

// APISlices turns the plugin's pool into the ResourceSlices the
// resourceslice controller would store.
func APISlices(res resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	pool := res.Pools[Node]
	var out []*resourceapi.ResourceSlice
	for i, s := range pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", Node, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         configapi.DriverName,
				Pool:           resourceapi.ResourcePool{Name: Node, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName:       ptr.To(Node),
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}

// OneDeviceClaim is an unallocated claim of one device of class.
func OneDeviceClaim(class string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "claim-uid"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
}

// ClassLister serves a catalog's classes to the allocator.
type ClassLister map[string]*resourceapi.DeviceClass

// List implements the allocator's DeviceClassLister.
func (l ClassLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

// Get implements the allocator's DeviceClassLister.
func (l ClassLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("no DeviceClass %q", name)
}

// CELClass is a DeviceClass selecting by one CEL expression.
func CELClass(name, expr string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}},
	}
}

// RestartWith plays the plugin's restart on e: a State newState builds on
// its directories (with new metrics), restored with apiClaims in the API.
func RestartWith[S Restorer](t *testing.T, e *Env, newState func(testing.TB) S, apiClaims ...*resourceapi.ResourceClaim) S {
	t.Helper()
	e.Metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	s := newState(t)
	Restore(t, e, s, apiClaims...)
	return s
}
