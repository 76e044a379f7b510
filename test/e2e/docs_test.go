package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/test/docs"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestDocs applies every YAML example of README.md, docs/ and the chart's
// README to the real API server (kubectl apply --dry-run=server): the
// built-in kinds, our CRDs and Kueue's, with their validation and
// defaulting, each block's namespaced objects in a fresh namespace. Helm
// values are rendered with the chart (its schema included), and so are
// NodeConfig files, as the chart's kubeletPlugin.nodeConfig. Other
// fragments, marked "# fragment:", are checked by test/docs only.
func TestDocs(t *testing.T) {
	blocks, err := docs.Blocks(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	installCRDs(t)
	kubectl := filepath.Join(cp.BinDir, "kubectl")
	kueueCRDs := false
	applied, rendered := 0, 0
	for _, b := range blocks {
		t.Run(b.Name(), func(t *testing.T) {
			values, err := nodeConfigValues(b)
			if b.HelmValues {
				values, err = b.Values()
			}
			if err != nil {
				t.Fatal(err)
			}
			if values != nil {
				data, err := yaml.Marshal(values)
				if err != nil {
					t.Fatal(err)
				}
				ns := cp.CreateNamespace(t, "docs")
				_, objs := renderChart(t, "docs", ns, "--values", writeValues(t, "values.yaml", string(data)))
				t.Logf("helm template with the example as values: %d objects", len(objs))
				rendered++
				return
			}
			if b.Fragment != "" {
				t.Skipf("fragment (%s): parsed by test/docs only", b.Fragment)
			}
			objs, _, err := docs.Objects(b)
			if err != nil {
				t.Fatal(err)
			}
			var file bytes.Buffer
			n := 0
			for _, o := range objs {
				if strings.HasPrefix(o.GetAPIVersion(), "kueue.x-k8s.io/") && !kueueCRDs {
					installKueueCRDs(t)
					kueueCRDs = true
				}
				o.SetNamespace("") // into this block's namespace
				data, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				file.WriteString("---\n")
				file.Write(data)
				n++
			}
			ns := cp.CreateNamespace(t, "docs")
			path := writeValues(t, "example.yaml", file.String())
			ctx := framework.Context(t, 2*time.Minute)
			out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "apply",
				"--dry-run=server", "--namespace", ns, "-f", path).CombinedOutput()
			if err != nil {
				t.Fatalf("kubectl apply --dry-run=server of the example at %s: %v\n%s\n%s", b.Name(), err, out, file.String())
			}
			if got := strings.Count(string(out), "(server dry run)"); got != n {
				t.Fatalf("the API server accepted %d of %d objects:\n%s", got, n, out)
			}
			applied += n
		})
	}
	t.Logf("%d YAML blocks in the docs: %d objects accepted by the API server (server dry run), %d Helm values blocks rendered with the chart",
		len(blocks), applied, rendered)
}

// installKueueCRDs applies the CRDs of the Kueue release make kueue built
// and waits until its kinds are served.
func installKueueCRDs(t *testing.T) {
	t.Helper()
	dir := filepath.Join(repoRoot, "_output", "kueue", "crds")
	if _, err := os.Stat(dir); err != nil {
		if framework.Required() {
			t.Fatalf("Kueue's CRDs not found at %s (E2E_REQUIRED=1): run make kueue", dir)
		}
		t.Skipf("Kueue's CRDs not found at %s; run make kueue", dir)
	}
	ctx := framework.Context(t, 2*time.Minute)
	if _, err := cp.Apply(ctx, dir, ""); err != nil {
		t.Fatalf("installing Kueue's CRDs: %v", err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, plural := range []string{"clusterqueues", "localqueues", "resourceflavors"} {
			if _, err := cp.Dynamic.Resource(framework.KueueResource(plural)).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("Kueue's CRDs not served: %v", err)
	}
}

// nodeConfigValues turns a block that is one NodeConfig file into the
// chart's values that write it; nil for any other block.
func nodeConfigValues(b docs.Block) (map[string]any, error) {
	if b.Fragment != "" {
		return nil, nil
	}
	objs, _, err := docs.Objects(b)
	if err != nil || len(objs) != 1 || objs[0].GetKind() != "NodeConfig" {
		return nil, err
	}
	cfg := objs[0].Object
	delete(cfg, "apiVersion")
	delete(cfg, "kind")
	return map[string]any{"kubeletPlugin": map[string]any{"nodeConfig": cfg}}, nil
}
