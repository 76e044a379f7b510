package prepare

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// procDevicesPath is the env's fake /proc/devices, beside its fake
// mig-minors.
func procDevicesPath(e *testEnv) string {
	return filepath.Join(filepath.Dir(e.MigMinors), "devices")
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// minorOf reads one entry of a mig-minors text.
func minorOf(t *testing.T, minors, key string) int64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(minors))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in the minors file", key)
	return -1
}

// capNodes are the /dev/nvidia-caps nodes of a spec's devices.
func capNodes(spec *cdi.Spec) []*specs.DeviceNode {
	var out []*specs.DeviceNode
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			if strings.HasPrefix(n.Path, "/dev/nvidia-caps/") {
				out = append(out, n)
			}
		}
	}
	return out
}

// The capability nodes of a MIG device exist on the host only once some
// process there opened them, which a MIG device the plugin just created
// never had. Named by path only, the runtime stats a missing host node and
// the container fails. Fully specified (type c, the nvidia-caps major of
// /proc/devices, the minor of mig-minors), the runtime creates them in the
// container.
func TestMIGCapNodesAreFullCharDevices(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	minors := preparetest.MinorsFile(8)
	writeTestFile(t, e.MigMinors, minors)
	const capsMajor = 237
	writeTestFile(t, procDevicesPath(e), fmt.Sprintf("Character devices:\n  1 mem\n195 nvidia\n%d nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  7 loop\n%d nvidia-caps-fake-block\n", capsMajor, capsMajor+1))
	name := e.Partition(t, 2, "1g.10gb")
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", name).Build()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	inst := e.MIGDevices(t, 2)[0]
	gpu := e.Lib.GPUs()[2].Minor
	want := map[string]int64{}
	for _, key := range []string{fmt.Sprintf("gpu%d/gi%d/access", gpu, inst.GIID), fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpu, inst.GIID, inst.CIID)} {
		minor := minorOf(t, minors, key)
		want[fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor)] = minor
	}
	nodes := capNodes(preparetest.ReadClaimSpec(t, e.Env, "m"))
	if len(nodes) != len(want) {
		t.Fatalf("capability nodes %+v, want %v", nodes, want)
	}
	for _, n := range nodes {
		minor, ok := want[n.Path]
		if !ok || n.Type != "c" || n.Major != capsMajor || n.Minor != minor {
			t.Errorf("capability node %+v: want %s, type c, major %d (nvidia-caps in /proc/devices), minor %d", *n, n.Path, capsMajor, minor)
		}
	}
}

// Admin access is for monitoring what other claims use. On a dynamic MIG
// partition it gave the parent GPU (its UUID, no capability nodes): with
// MIG off that is the whole GPU. It must give the MIG device another claim
// created there, and create or destroy nothing itself.
func TestAdminAccessToDynamicMIGObservesTheMIGDevice(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	writeTestFile(t, e.MigMinors, preparetest.MinorsFile(8))
	name := e.Partition(t, 2, "1g.10gb")
	parent := e.Lib.GPUs()[2].UUID

	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("mon-early").AdminDevice("mig", name).Build()); err == nil {
		t.Error("admin access to a partition no MIG device occupies: want an error")
	}
	if insts := e.MIGDevices(t, 2); len(insts) != 0 {
		t.Fatalf("admin access created MIG devices: %+v", insts)
	}

	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", name).Build()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	inst := e.MIGDevices(t, 2)[0]
	devs, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("mon").AdminDevice("mig", name).Build())
	if err != nil {
		t.Fatalf("admin Prepare: %v", err)
	}
	checkSpecParses(t, e, "mon", devs[0].CDIDeviceIDs...)
	data, _ := os.ReadFile(cdipkg.SpecPath(e.CDIRoot, "mon"))
	if !strings.Contains(string(data), inst.UUID) || strings.Contains(string(data), parent) {
		t.Errorf("admin spec must name the MIG device %s, never its parent %s: %s", inst.UUID, parent, data)
	}
	if n := len(capNodes(preparetest.ReadClaimSpec(t, e.Env, "mon"))); n != 2 {
		t.Errorf("admin spec has %d capability nodes, want the MIG device's 2", n)
	}

	if err := e.state.Unprepare(e.Ctx, "mon"); err != nil {
		t.Fatal(err)
	}
	if insts := e.MIGDevices(t, 2); len(insts) != 1 || insts[0].UUID != inst.UUID {
		t.Errorf("after the admin claim left, MIG devices are %+v, want %s untouched", insts, inst.UUID)
	}
}
