package framework

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoRemovedGateReachesAComponent (issue 57): a gate a version removed
// never reaches that version's components, neither from docs/install.md's
// table (every version column, 1.38's included) nor from E2E_SUITE_GATES;
// older versions still get it.
func TestNoRemovedGateReachesAComponent(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2", "v1.38.0"} {
		doc, err := InstallDocGates(root, v)
		if err != nil {
			t.Errorf("%s: %v", v, err)
			continue
		}
		if strings.Contains(doc.FeatureGates, "DynamicResourceAllocation") && v == "v1.38.0" {
			t.Errorf("%s: docs/install.md enables DynamicResourceAllocation: %s", v, doc.FeatureGates)
		}
	}

	if err := CheckGates("v1.38.0-beta.0", "DRAConsumableCapacity=true,DynamicResourceAllocation=true"); err == nil ||
		!strings.Contains(err.Error(), "DynamicResourceAllocation was removed in Kubernetes 1.38") {
		t.Errorf("DynamicResourceAllocation for a 1.38 component: %v, want it refused", err)
	}
	for _, v := range []string{"v1.37.2", "v1.34.4", ""} {
		if err := CheckGates(v, "DynamicResourceAllocation=true"); err != nil {
			t.Errorf("DynamicResourceAllocation for %q: %v, want it passed", v, err)
		}
	}

	t.Setenv(SuiteVersionEnv, "v1.38.0")
	t.Setenv(SuiteGatesEnv, "DynamicResourceAllocation=true")
	var opts Options
	if err := suiteVersion(&opts); err == nil {
		t.Errorf("a 1.38 suite was set up with --feature-gates=%s", opts.FeatureGates)
	}
	t.Setenv(SuiteGatesEnv, DocGates)
	opts = Options{}
	if err := suiteVersion(&opts); err != nil || opts.FeatureGates != "" {
		t.Errorf("a 1.38 suite with the documented gates: %v, gates %q, want none (1.38 has none left to enable)", err, opts.FeatureGates)
	}
}

// A skew run's kubelet comes from where E2E_SUITE_KUBELET_K8S says, the
// control plane still from its version; a kubelet that is not there stops
// the suite before it starts rather than running the control plane's.
func TestASkewedKubeletComesFromItsOwnDir(t *testing.T) {
	own := t.TempDir()
	t.Setenv(SuiteVersionEnv, "v1.38.0-beta.0")
	t.Setenv(SuiteGatesEnv, DefaultGates)
	t.Setenv(SuiteKubeletEnv, OwnKubelet)
	opts := Options{BinDir: own}
	if err := suiteVersion(&opts); err == nil {
		t.Fatalf("a skew run with no kubelet in %s was set up", own)
	}
	if err := os.WriteFile(filepath.Join(own, "kubelet"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	opts = Options{BinDir: own}
	if err := suiteVersion(&opts); err != nil {
		t.Fatal(err)
	}
	cp := &ControlPlane{BinDir: own, VersionBinDir: opts.VersionBinDir, kubeletBinDir: opts.KubeletBinDir}
	if got := cp.kubernetesBinary("kubelet"); got != filepath.Join(own, "kubelet") {
		t.Errorf("the kubelet of a skew run is %s, want the suite's own in %s", got, own)
	}
	if got, want := cp.kubernetesBinary("kube-apiserver"), filepath.Join(opts.VersionBinDir, "kube-apiserver"); got != want || opts.VersionBinDir == "" {
		t.Errorf("the API server of a skew run is %s, want %s", got, want)
	}
}
