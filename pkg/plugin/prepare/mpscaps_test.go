package prepare

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
)

const mpsHead = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":`

// A tenant's 1Gi share of an 80 GB GPU is 2% of its threads: a claim
// config that asks for all of them is refused, with the cap named, and
// nothing reaches a CDI spec.
func TestMPSThreadsAboveTheShareAreRefused(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	claim := mpsShareClaim("a", "1Gi").Config(resourceapi.AllocationConfigSourceClaim, mpsHead+`{"defaultActiveThreadPercentage":100}}}`).Build()
	_, err := e.state.Prepare(e.Ctx, claim)
	if err == nil || !strings.Contains(err.Error(), "mpsConfig.defaultActiveThreadPercentage 100 is above the cap of 2 (the device's share of its GPU)") {
		t.Fatalf("err = %v", err)
	}
	if e.CDISpecExists("a") {
		t.Error("a refused claim left a CDI spec")
	}
}

// The class's config (the admin's) caps what a claim's config may ask;
// the claim may only lower it, and without a limit of its own it gets the
// class's, not the share's.
func TestClassMPSConfigCapsTheClaims(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	class := mpsHead + `{"defaultActiveThreadPercentage":5,"defaultPinnedDeviceMemoryLimit":"4Gi"}}}`
	for uid, tc := range map[string]struct{ claim, want string }{
		"threads": {mpsHead + `{"defaultActiveThreadPercentage":10}}}`, "mpsConfig.defaultActiveThreadPercentage 10 is above the cap of 5 (the class's config)"},
		"memory":  {mpsHead + `{"defaultPinnedDeviceMemoryLimit":"8Gi"}}}`, "mpsConfig.defaultPinnedDeviceMemoryLimit 8Gi is above the cap of 4Gi (the class's config)"},
	} {
		claim := mpsShareClaim(uid, "10Gi").Config(resourceapi.AllocationConfigSourceClass, class).
			Config(resourceapi.AllocationConfigSourceClaim, tc.claim).Build()
		if _, err := e.state.Prepare(e.Ctx, claim); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s above the class: err = %v, want %q", uid, err, tc.want)
		}
	}
	for uid, tc := range map[string]struct{ claim, threads, memory string }{
		"lower":  {mpsHead + `{"defaultActiveThreadPercentage":3}}}`, "=3\n", "=4096M"},
		"silent": {`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`, "=5\n", "=4096M"},
	} {
		claim := mpsShareClaim(uid, "10Gi").Config(resourceapi.AllocationConfigSourceClass, class).
			Config(resourceapi.AllocationConfigSourceClaim, tc.claim).Build()
		if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
			t.Fatalf("%s: %v", uid, err)
		}
		data, err := os.ReadFile(cdipkg.SpecPath(e.CDIRoot, uid))
		if err != nil {
			t.Fatal(err)
		}
		env := envLines(string(data))
		if !slices.Contains(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"+strings.TrimSpace(tc.threads)) ||
			!slices.ContainsFunc(env, func(s string) bool {
				return strings.HasSuffix(s, tc.memory) && strings.HasPrefix(s, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
			}) {
			t.Errorf("%s: spec's MPS environment %v, want threads %s and memory %s", uid, env, strings.TrimSpace(tc.threads), tc.memory)
		}
	}
}

// The GPU's daemon binds clients that drop their environment: its limits
// are the node configuration's (one replica of GPU 6 is half of it), not
// the largest any claim asked for.
func TestMPSDaemonDefaultsComeFromTheNodeConfig(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	small := mpsHead + `{"defaultActiveThreadPercentage":10}}}`
	for _, uid := range []string{"a", "b"} {
		dev := map[string]string{"a": "gpu-6-ts-0", "b": "gpu-6-ts-1"}[uid]
		claim := preparetest.NewClaim(uid).Device("gpu", dev).Config(resourceapi.AllocationConfigSourceClaim, small).Build()
		if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	var set []string
	for _, c := range run.take() {
		if strings.Contains(c, "set_default_active_thread_percentage") {
			set = append(set, c)
		}
	}
	replica := e.state.DeviceMap()["gpu-6-ts-0"].API.Capacity["memory"].Value
	want := "nvidia-cuda-mps-control set_default_active_thread_percentage 50 set_default_device_pinned_mem_limit 0 " + mib(replica.Value())
	if len(set) == 0 || slices.ContainsFunc(set, func(c string) bool { return c != want }) {
		t.Errorf("daemon defaults set %q, want only %q", set, want)
	}
}

// envLines are the KEY=VALUE strings of a CDI spec's JSON.
func envLines(spec string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(spec, func(r rune) bool { return r == '"' }) {
		if strings.HasPrefix(f, "CUDA_MPS_") {
			out = append(out, f)
		}
	}
	return out
}

// mib is a memory limit as the plugin gives it to the MPS daemon.
func mib(bytes int64) string { return fmt.Sprintf("%dM", bytes>>20) }
