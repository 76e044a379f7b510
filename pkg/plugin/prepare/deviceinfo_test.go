package prepare

import (
	"os"
	"strconv"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Issue 27: dcgm-exporter attributes GPU series to pods only for NVIDIA's
// own driver, so nothing told which claim a GPU's telemetry belonged to.
// Each prepared device now has an info series naming its claim, the GPU's
// UUID and, for a dynamic MIG device, its GPU instance and MIG UUID; the
// series goes with the claim. And the prepare/unprepare error series exist
// at 0 from the start, so an alert on their increase sees the first error.
func TestPreparedDeviceInfo(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	e.Metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	e.state = e.newState(t)
	if err := os.WriteFile(e.MigMinors, []byte(preparetest.MinorsFile(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := testutil.CollectAndCount(e.Metrics.Operations); got != 4 {
		t.Errorf("%d claim operation series before any operation, want prepare/unprepare x success/error", got)
	}
	name := e.Partition(t, 2, "1g.10gb")
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", name).Build()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	inst := e.MIGDevices(t, 2)[0]
	series := e.Metrics.DeviceInfo.WithLabelValues("team-a", "claim-m", name, e.GPUUUID(2), strconv.Itoa(inst.GIID), inst.UUID)
	if got := testutil.ToFloat64(series); got != 1 {
		t.Errorf("prepared_device_info for the MIG device = %v, want 1", got)
	}
	if got := testutil.CollectAndCount(e.Metrics.DeviceInfo); got != 1 {
		t.Errorf("%d info series for one prepared device", got)
	}
	if err := e.state.Unprepare(e.Ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.CollectAndCount(e.Metrics.DeviceInfo); got != 0 {
		t.Errorf("%d info series after unprepare, want none", got)
	}
}
