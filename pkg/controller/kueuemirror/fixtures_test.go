package kueuemirror

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// Fixtures, as pkg/controller's tests have them.

var gpuProfile = testworld.GpuProfile

// catalog is the profiles every controller test starts from.
func catalog() []client.Object {
	return []client.Object{
		gpuProfile("h100", gpuaas.ProfileSelector{Type: "gpu"}),
		gpuProfile("mig-1g", gpuaas.ProfileSelector{MigProfile: "1g.10gb"}),
	}
}

func tenantQuota(name string, created int, spec gpuaas.TenantQuotaSpec) *gpuaas.TenantQuota {
	return &gpuaas.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+created), 0))},
		Spec:       spec,
	}
}

func qty(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

func newFakeClient(t testing.TB, objs ...client.Object) client.WithWatch {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := gpuaas.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithStatusSubresource(&gpuaas.GpuProfile{}, &gpuaas.TenantQuota{}).
		WithGlobalResourceVersionCounter(). // comparable, as etcd's are
		Build()
}

func ctx(t testing.TB) context.Context { return t.Context() }
