package plugin

import (
	"context"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
)

// The kubelet may open its health stream before the start subscribes the
// driver to the monitor (here: one that never says it watches, so the
// subscription goes ahead when its wait ends): the stream's channel of
// changes is written and read under the driver's lock (go test -race
// tells).
func TestHealthStreamOpenedBeforeTheStartSubscribes(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	d, _ := testDriver(t, e, everyMode())
	d.health = health.New(e.Lib, health.Config{}, nil)
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	reports := make(chan kubeletplugin.DeviceHealthReport, 1)
	streamDone := make(chan struct{})
	go func() { defer close(streamDone); _ = d.WatchHealthStatus(ctx, reports) }()
	// The wait for the monitor ends by its own deadline, not by anything
	// the stream does.
	subscribeCtx, stop := context.WithTimeout(e.Ctx, 100*time.Millisecond)
	defer stop()
	d.watchHealth(subscribeCtx)
	if report := <-reports; len(report.Devices) == 0 {
		t.Error("the first health report lists no device")
	}
	cancel()
	<-streamDone
}
