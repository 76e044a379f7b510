package gpunode

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// The fixtures are testworld's (slices and claims of our driver, following
// the plugin's device model), under the names these tests use.
const driver = testworld.Driver

var (
	attr          = testworld.Attr
	intAttr       = testworld.IntAttr
	resourceSlice = testworld.ResourceSlice
	claim         = testworld.Claim
	allocatedTo   = testworld.AllocatedTo
)

// testScheme knows the built-in types and ours, as the controller's.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := gpuaas.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func ctx(t testing.TB) context.Context { return t.Context() }
