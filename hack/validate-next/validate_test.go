// Package validatenext runs the next Kubernetes minor's own validation
// (k8s.io/kubernetes/pkg/apis/resource/validation of v1.38, on Go 1.27: a
// module of its own, as the project's stays on the 0.37 libraries) on the
// objects the project writes, as the API server does: decoded from
// resource.k8s.io/v1 with its defaults, converted to the internal types,
// checked by the handwritten validation and by the declarative one
// registered in the scheme (issue 57). make validate-next writes the
// objects (hack/writtenobjects) and runs it.
package validatenext

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	"k8s.io/kubernetes/pkg/apis/resource/validation"
	_ "k8s.io/kubernetes/pkg/features" // the release's gates, with their defaults
)

// objectsEnv names the directory hack/writtenobjects wrote.
const objectsEnv = "WRITTEN_OBJECTS"

// TestEveryWrittenObjectValidates: every slice the plugin publishes (every
// node configuration, healthy and tainted), every class the catalog
// renders and every template the shapes render passes 1.38's validation.
func TestEveryWrittenObjectValidates(t *testing.T) {
	dir := os.Getenv(objectsEnv)
	if dir == "" {
		t.Fatalf("%s is not set: run make validate-next, which writes the objects first", objectsEnv)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no objects in %s (%v): hack/writtenobjects wrote nothing", dir, err)
	}
	kinds := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		kind, errs := validate(t.Context(), data)
		kinds[kind]++
		if len(errs) > 0 {
			t.Errorf("%s: Kubernetes 1.38 refuses this %s:\n%s", filepath.Base(f), kind, errs.ToAggregate())
		}
	}
	for _, k := range []string{"ResourceSlice", "DeviceClass", "ResourceClaimTemplate"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the written objects (%v)", k, kinds)
		}
	}
	t.Logf("validated %d objects with Kubernetes 1.38's validation: %v", len(files), kinds)
}

// TestValidationRefusesWhat138Refuses: the check is not blind. A slice
// that 1.37 kept and 1.38 refuses (a qualified attribute name with two
// slashes) and one refused by every version are both caught.
func TestValidationRefusesWhat138Refuses(t *testing.T) {
	for name, tc := range map[string]struct{ attribute, want string }{
		"two slashes in a qualified name": {"gpu.gpuaas.io/a/b", "attributes"},
		"an attribute name too long":      {strings.Repeat("a", 100), "attributes"},
	} {
		t.Run(name, func(t *testing.T) {
			slice := fmt.Sprintf(`{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"bad"},
				"spec":{"driver":"gpu.gpuaas.io","pool":{"name":"n","generation":1,"resourceSliceCount":1},"nodeName":"n",
				"devices":[{"name":"gpu-0","attributes":{%q:{"string":"x"}}}]}}`, tc.attribute)
			_, errs := validate(t.Context(), []byte(slice))
			if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
				t.Errorf("attribute %q: errors %v, want one about %s", tc.attribute, errs, tc.want)
			}
		})
	}
}

// validate decodes a resource.k8s.io/v1 object as the API server does and
// returns its kind and what 1.38 finds wrong with it.
func validate(ctx context.Context, data []byte) (string, field.ErrorList) {
	versioned, gvk, err := legacyscheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return "?", field.ErrorList{field.Invalid(field.NewPath(""), "", fmt.Sprintf("decoding: %v", err))}
	}
	legacyscheme.Scheme.Default(versioned)
	internal, err := legacyscheme.Scheme.ConvertToVersion(versioned, resource.SchemeGroupVersion.WithKind(gvk.Kind).GroupVersion())
	if err != nil {
		return gvk.Kind, field.ErrorList{field.InternalError(field.NewPath(""), fmt.Errorf("converting to the internal version: %w", err))}
	}
	errs := handwritten(internal)
	errs = append(errs, legacyscheme.Scheme.Validate(ctx, gateOptions(), versioned)...)
	return gvk.Kind, errs
}

// gateOptions are the validation options the API server passes the
// declarative validation: each feature gate of the release, as its
// defaults set it.
func gateOptions() map[string]bool {
	out := map[string]bool{}
	for name := range utilfeature.DefaultMutableFeatureGate.GetAll() {
		out[string(name)] = utilfeature.DefaultFeatureGate.Enabled(name)
	}
	return out
}

func handwritten(obj runtime.Object) field.ErrorList {
	switch o := obj.(type) {
	case *resource.ResourceSlice:
		return validation.ValidateResourceSlice(o)
	case *resource.DeviceClass:
		return validation.ValidateDeviceClass(o)
	case *resource.ResourceClaimTemplate:
		return validation.ValidateResourceClaimTemplate(o)
	case *resource.DeviceTaintRule:
		return validation.ValidateDeviceTaintRule(o)
	}
	return field.ErrorList{field.NotSupported[string](field.NewPath("kind"), fmt.Sprintf("%T", obj), nil)}
}
