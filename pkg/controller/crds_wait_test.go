package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Issue 26 item 8: the controller exited with "no matches for kind
// TenantQuota" when it started before its CRDs were served. setup now
// waits for them: it is still waiting while only one is served, and
// returns once both are.
func TestSetupWaitsForItsCRDs(t *testing.T) {
	m := &growingMapper{DefaultRESTMapper: meta.NewDefaultRESTMapper(nil)}
	profile := gpuaas.GroupVersion.WithKind(gpuaas.GpuProfileKind)
	quota := gpuaas.GroupVersion.WithKind(gpuaas.TenantQuotaKind)
	m.Add(profile, meta.RESTScopeRoot)
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() { done <- waitForKinds(ctx, m, profile, quota) }()
	select {
	case err := <-done:
		t.Fatalf("returned (%v) while TenantQuota is not served", err)
	case <-time.After(time.Second):
	}
	m.Add(quota, meta.RESTScopeNamespace) // its CRD is established now
	if err := <-done; err != nil {
		t.Fatalf("after the CRD was served: %v", err)
	}
}

// growingMapper is a REST mapper to which kinds are added while it is read,
// as discovery finds CRDs.
type growingMapper struct {
	mu sync.Mutex
	*meta.DefaultRESTMapper
}

func (g *growingMapper) Add(gvk schema.GroupVersionKind, scope meta.RESTScope) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.DefaultRESTMapper.Add(gvk, scope)
}

func (g *growingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.DefaultRESTMapper.RESTMapping(gk, versions...)
}
