package e2e

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestStaticMIGEndToEnd lays out MIG devices on GPU 0 of a node's simulated
// machine before its plugin starts, as an admin does with mig-parted
// (mocknvml mig-layout), offers the GPU as static MIG, and runs a claim on
// one of the devices through the real scheduler and the plugin: the
// container gets exactly that MIG device, and unprepare leaves the admin's
// devices as they were (static MIG is never created or destroyed).
func TestStaticMIGEndToEnd(t *testing.T) {
	ctx := framework.Context(t, 3*time.Minute)
	name, stateDir := nodeName(t), t.TempDir()
	made, err := nvmock.LayoutMIG(stateDir, "dgxh100", name, 0, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeNodeConfig(t, "static", "gpus:\n- indexes: [0]\n  mig: static\n")
	node := startNodeWith(t, framework.NodeOptions{Name: name, NodeConfig: cfg,
		ExtraArgs: []string{"--mock-nvml-state-dir=" + stateDir}})
	devices, err := node.WaitForDevices(ctx, 4+7)
	if err != nil {
		t.Fatal(err)
	}
	var static []string
	for _, d := range devices {
		if stringAttr(d, "type") == "mig" {
			static = append(static, d.Name+"="+stringAttr(d, "profile"))
		}
	}
	if len(static) != len(made) {
		t.Fatalf("published MIG devices %v, want the %d laid out", static, len(made))
	}
	t.Logf("static MIG devices published: %v", static)

	ns := cp.CreateNamespace(t, "static-mig")
	createSelectedPod(t, ctx, ns, "static", "mig.gpuaas.io", `device.attributes["gpu.gpuaas.io"].profile == "2g.20gb"`)
	pod := runningPod(t, ctx, ns, "static")
	claim := onlyClaim(t, ctx, pod)
	checkPrepared(t, node, pod, claim)
	spec, err := os.ReadFile(node.CDISpecPath(claim.UID))
	if err != nil {
		t.Fatal(err)
	}
	// ApplyLayout makes the layout largest first, wherever it fits: find
	// the 2g.20gb by its profile, not its position.
	i := slices.IndexFunc(made, func(inst mig.Instance) bool { return inst.Profile == "2g.20gb" })
	if i < 0 {
		t.Fatalf("the layout made %+v, no 2g.20gb", made)
	}
	want := made[i]
	if !strings.Contains(string(spec), want.UUID) {
		t.Fatalf("CDI spec of the static claim does not name MIG device %s: %s", want.UUID, spec)
	}
	deletePod(t, ctx, ns, "static")
	checkUnprepared(t, node, claim)
	if left := migDevicesOf(t, stateDir, name); len(left) != len(made) {
		t.Fatalf("after unprepare the GPU holds %d MIG devices, want the admin's %d untouched", len(left), len(made))
	}
}

// migDevicesOf lists GPU 0's MIG devices on the node's simulated machine,
// opened beside the running plugin as another process would.
func migDevicesOf(t *testing.T, stateDir, node string) []mig.Instance {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: node, MockStateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lib.Shutdown() }()
	dev, err := lib.DeviceByUUID(lib.GPUs()[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	insts, err := mig.List(dev)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}
