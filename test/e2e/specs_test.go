package e2e

import (
	"cmp"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestDemoSpecs applies every YAML file under demo/specs, in order, on one
// 8-GPU node and checks that each pod runs with its claims allocated to our
// devices and prepared. The files stay applied until the end, so this also
// checks that all scenarios fit on one node together, as in `make demo`.
func TestDemoSpecs(t *testing.T) {
	node := startNode(t)
	startControllerBinary(t)
	specs := filepath.Join(repoRoot, "demo", "specs")
	files, err := framework.YAMLFiles(specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("found %d YAML files under %s, want the catalog and scenarios", len(files), specs)
	}
	for _, file := range files {
		rel, _ := filepath.Rel(specs, file)
		t.Run(rel, func(sub *testing.T) { checkSpecFile(sub, t, node, file) })
	}
}

// checkSpecFile applies one file into the namespaces it declares (or a fresh
// one for objects without namespace) and checks its pods. The declared
// namespaces are deleted when the parent test ends, not this subtest, so
// the GPUs of all files stay allocated together.
func checkSpecFile(t, parent *testing.T, node *framework.Node, file string) {
	ctx := framework.Context(t, 3*time.Minute)
	objs, err := framework.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	applied := applySpec(t, parent, file, objs, "spec")
	for _, obj := range applied {
		if obj.GetKind() != "Pod" {
			continue
		}
		pod := runningPod(t, ctx, obj.GetNamespace(), obj.GetName())
		claims := podClaims(t, ctx, pod)
		if len(claims) == 0 {
			t.Errorf("pod %s/%s uses no ResourceClaim; demo pods should", pod.Namespace, pod.Name)
		}
		for _, claim := range claims {
			checkPrepared(t, node, pod, claim)
		}
		t.Logf("pod %s/%s running, CDI devices %v", pod.Namespace, pod.Name, cdiDevices(t, pod))
	}
}

// applySpec applies a spec file's objects (read, perhaps changed, by the
// caller) into the namespaces they declare, or a fresh one named after
// prefix for objects without one, logs the denials the file expects, and
// deletes the declared namespaces when parent ends.
func applySpec(t, parent *testing.T, file string, objs []*unstructured.Unstructured, prefix string) []*unstructured.Unstructured {
	t.Helper()
	applied, _ := applySpecRefusing(t, parent, file, objs, prefix, nil)
	return applied
}

// applySpecRefusing is applySpec where the objects mayRefuse picks may be
// refused at admission: it returns those refused, by namespace/name, with
// the refusal, and applies the rest in the file's order.
func applySpecRefusing(t, parent *testing.T, file string, objs []*unstructured.Unstructured, prefix string,
	mayRefuse func(*unstructured.Unstructured) bool) ([]*unstructured.Unstructured, map[string]string) {
	t.Helper()
	defaultNS := ""
	if needsNamespace(objs) {
		defaultNS = cp.CreateNamespace(parent, prefix)
	}
	ctx := framework.Context(t, time.Minute)
	var applied, pending []*unstructured.Unstructured
	refused := map[string]string{}
	flush := func() {
		out, denials, err := cp.ApplyObjects(ctx, file, pending, defaultNS)
		applied, pending = append(applied, out...), nil
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range denials {
			t.Logf("%s %s denied as expected: %s", d.Object.GetKind(), d.Object.GetName(), d.Message)
		}
	}
	for _, obj := range objs {
		if mayRefuse == nil || !mayRefuse(obj) {
			pending = append(pending, obj)
			continue
		}
		flush()
		out, err := cp.ApplyObject(ctx, obj, defaultNS)
		if err != nil {
			refused[cmp.Or(obj.GetNamespace(), defaultNS)+"/"+obj.GetName()] = err.Error()
			continue
		}
		applied = append(applied, out)
	}
	flush()
	for _, obj := range applied {
		if obj.GetKind() == "Namespace" {
			cp.DeleteNamespaceAtCleanup(parent, obj.GetName())
		}
	}
	return applied, refused
}

// needsNamespace reports whether a file has namespaced objects (we only
// know pods and DRA claims here) without a namespace.
func needsNamespace(objs []*unstructured.Unstructured) bool {
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "DeviceClass", "GpuProfile", "TenantQuota":
		default:
			if o.GetNamespace() == "" {
				return true
			}
		}
	}
	return false
}

// startControllerBinary runs the dra-controller binary (catalog and quota)
// for the rest of the test, as `make demo` does.
func startControllerBinary(t *testing.T) {
	t.Helper()
	ctx := framework.Context(t, 5*time.Minute)
	bin, err := framework.Build(ctx, t.TempDir(), "cmd/dra-controller")
	if err != nil {
		t.Fatal(err)
	}
	p, err := cp.StartController(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dra-controller log %s, last lines:\n%s", p.LogPath, p.Tail(40))
		}
		if err := p.Stop(); err != nil {
			t.Errorf("stopping dra-controller: %v", err)
		}
	})
}
