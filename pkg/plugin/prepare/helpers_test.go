package prepare

import (
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

const testNode = preparetest.Node

// testEnv is a State on a mock machine with its directories
// (preparetest.Env), so that a second State on the same directories plays
// the restarted plugin.
type testEnv struct {
	*preparetest.Env
	state *State
	// wrapCDI, when set, wraps each new State's CDI writer (fault hooks).
	wrapCDI func(CDIWriter) CDIWriter
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
func (e *testEnv) newState(t testing.TB) *State {
	t.Helper()
	handler := e.NewCDIHandler(t)
	var writer CDIWriter = handler
	if e.wrapCDI != nil {
		writer = e.wrapCDI(handler)
	}
	return NewState(StateConfig{NodeName: testNode, Devices: e.Devices, NVML: e.Lib, CDI: writer, Store: e.NewStore(t),
		Metrics: e.Metrics, MigMinorsPath: e.MigMinors, Sharing: device.NewSharing(e.Sharing), BootIDPath: e.BootID,
		Events: e.NodeEvents()})
}

// restore runs s's Restore as Start does, with apiClaims in the API.
func restore(t *testing.T, e *testEnv, s *State, apiClaims ...*resourceapi.ResourceClaim) {
	preparetest.Restore(t, e.Env, s, apiClaims...)
}

func typesUID(s string) types.UID { return types.UID(s) }

func everyMode() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
	}}
}
