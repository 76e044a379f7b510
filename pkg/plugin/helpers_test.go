package plugin

import (
	"strconv"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
)

const testNode = preparetest.Node

// testEnv is a State on a mock machine with its directories
// (preparetest.Env), so that a second State on the same directories plays
// the restarted plugin.
type testEnv struct {
	*preparetest.Env
	state *prepare.State
	// wrapCDI, when set, wraps each new State's CDI writer (fault hooks).
	wrapCDI func(prepare.CDIWriter) prepare.CDIWriter
	// faults and inUseRetry, when set, go to each new State: the health
	// monitor, and how a MIG mode change waits for a held GPU.
	faults     device.FaultRecorder
	inUseRetry mig.InUseRetry
	// cdiHandler is the CDI handler of the State built last.
	cdiHandler *cdi.Handler
}

func newTestEnv(t testing.TB, machine string) *testEnv {
	t.Helper()
	return newTestEnvWith(t, machine, &configapi.NodeConfig{})
}

// newTestEnvWith builds the env for a node configuration (GPU modes).
func newTestEnvWith(t testing.TB, machine string, cfg *configapi.NodeConfig) *testEnv {
	t.Helper()
	return newTestEnvIn(t, machine, cfg, "")
}

// newTestEnvIn is newTestEnvWith on a mock machine kept in mockStateDir;
// empty keeps it in memory.
func newTestEnvIn(t testing.TB, machine string, cfg *configapi.NodeConfig, mockStateDir string) *testEnv {
	t.Helper()
	e := &testEnv{Env: preparetest.NewEnv(t, machine, cfg, mockStateDir)}
	e.state = e.newState(t)
	return e
}

// newState builds a State on the env's directories, as a (re)started
// plugin would.
func (e *testEnv) newState(t testing.TB) *prepare.State {
	t.Helper()
	handler := e.NewCDIHandler(t)
	e.cdiHandler = handler
	var writer prepare.CDIWriter = handler
	if e.wrapCDI != nil {
		writer = e.wrapCDI(handler)
	}
	return prepare.NewState(prepare.StateConfig{NodeName: testNode, Devices: e.Devices, NVML: e.Lib, CDI: writer, Store: e.NewStore(t),
		Metrics: e.Metrics, MigMinorsPath: e.MigMinors, Sharing: device.NewSharing(e.Sharing), BootIDPath: e.BootID,
		Events: e.NodeEvents(), Faults: e.faults, InUseRetry: e.inUseRetry})
}

func restartWith(t *testing.T, e *testEnv, apiClaims ...*resourceapi.ResourceClaim) *prepare.State {
	t.Helper()
	return preparetest.RestartWith(t, e.Env, e.newState, apiClaims...)
}

// newModeEnv is a dynamic-MIG node on a persistent mock machine whose
// MIG mode changes wait briefly for a held GPU.
func newModeEnv(t *testing.T) *testEnv {
	t.Helper()
	e := newTestEnvIn(t, "dgxh100", preparetest.DynamicAll(), t.TempDir())
	e.inUseRetry = preparetest.FastInUseRetry
	e.state = e.newState(t)
	return e
}

// gpuNodes are the /dev/nvidiaN minors a claim's CDI spec names.
func gpuNodes(t *testing.T, e *testEnv, uid string) []int {
	t.Helper()
	var out []int
	for _, d := range preparetest.ReadClaimSpec(t, e.Env, uid).Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			if m := preparetest.GPUNodePath.FindStringSubmatch(n.Path); m != nil {
				minor, _ := strconv.Atoi(m[1])
				out = append(out, minor)
			}
		}
	}
	return out
}

func (e *testEnv) minorNow(t *testing.T, index int) int {
	t.Helper()
	minor, ret := e.GPUDev(t, index).GetMinorNumber()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return minor
}

// unitModes offers a mock DGX H100's GPU 0 as dynamic MIG, 1 as static
// MIG (3g + 2g + 1g + 1g made by the admin), 2 as 3 time-slice replicas,
// 3 shared, the others whole.
func unitModes(t *testing.T, units *bool) (*testEnv, *configapi.NodeConfig) {
	t.Helper()
	e := newTestEnv(t, "dgxh100")
	return e, e.MakeUnitModes(t, units)
}
