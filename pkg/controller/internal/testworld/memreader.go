package testworld

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// MemReader stands in for the informer cache in benchmarks: objects in
// maps indexed by namespace, lists without deep copies (as the controller
// reads the cache with UnsafeDisableDeepCopy). The fake client deep-copies
// every object and would measure itself.
type MemReader struct {
	mu      sync.RWMutex
	objects map[string]map[string]map[string]client.Object // kind -> namespace -> name
}

// NewMemReader holds objs.
func NewMemReader(objs ...client.Object) *MemReader {
	m := &MemReader{objects: map[string]map[string]map[string]client.Object{}}
	for _, o := range objs {
		m.Put(o)
	}
	return m
}

func kindOf(o runtime.Object) string { return fmt.Sprintf("%T", o) }

// Put adds or replaces o, as an informer event would.
func (m *MemReader) Put(o client.Object) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := kindOf(o)
	if m.objects[k] == nil {
		m.objects[k] = map[string]map[string]client.Object{}
	}
	if m.objects[k][o.GetNamespace()] == nil {
		m.objects[k][o.GetNamespace()] = map[string]client.Object{}
	}
	m.objects[k][o.GetNamespace()][o.GetName()] = o
}

// Remove deletes o.
func (m *MemReader) Remove(o client.Object) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objects[kindOf(o)][o.GetNamespace()], o.GetName())
}

// Get reads a Namespace or a ResourceClaim.
func (m *MemReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	o, ok := m.objects[kindOf(obj)][key.Namespace][key.Name]
	if !ok {
		return apierrors.NewNotFound(resourceapi.Resource("object"), key.Name)
	}
	switch dst := obj.(type) {
	case *corev1.Namespace:
		*dst = *o.(*corev1.Namespace)
	case *resourceapi.ResourceClaim:
		*dst = *o.(*resourceapi.ResourceClaim)
	default:
		return fmt.Errorf("MemReader: Get of %T", obj)
	}
	return nil
}

// List lists the kinds the accountant reads.
func (m *MemReader) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := &client.ListOptions{}
	lo.ApplyOptions(opts)
	m.mu.RLock()
	defer m.mu.RUnlock()
	switch l := list.(type) {
	case *resourceapi.ResourceClaimList:
		l.Items = collect[resourceapi.ResourceClaim](m.objects[kindOf(&resourceapi.ResourceClaim{})], lo.Namespace)
	case *resourceapi.ResourceSliceList:
		l.Items = collect[resourceapi.ResourceSlice](m.objects[kindOf(&resourceapi.ResourceSlice{})], "")
	case *resourceapi.DeviceClassList:
		l.Items = collect[resourceapi.DeviceClass](m.objects[kindOf(&resourceapi.DeviceClass{})], "")
	case *gpuaas.GpuProfileList:
		l.Items = collect[gpuaas.GpuProfile](m.objects[kindOf(&gpuaas.GpuProfile{})], "")
	case *gpuaas.TenantQuotaList:
		l.Items = collect[gpuaas.TenantQuota](m.objects[kindOf(&gpuaas.TenantQuota{})], "")
	case *corev1.NamespaceList:
		l.Items = collect[corev1.Namespace](m.objects[kindOf(&corev1.Namespace{})], "")
	default:
		return fmt.Errorf("MemReader: List of %T", list)
	}
	return nil
}

// collect lists one namespace, or all when namespace is "" (cluster-scoped
// kinds live under "").
func collect[T any, P interface {
	*T
	client.Object
}](byNamespace map[string]map[string]client.Object, namespace string) []T {
	var out []T
	for ns, objs := range byNamespace {
		if namespace != "" && ns != namespace {
			continue
		}
		for _, o := range objs {
			out = append(out, *any(o).(P))
		}
	}
	return out
}
