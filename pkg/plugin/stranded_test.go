package plugin

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// A claim allocated on a device the node no longer publishes (a replica
// of a GPU the node configuration now offers whole: allocated before the
// change) is stranded: no prepare can succeed. The plugin says so on the
// claim, an event and its device's Ready condition with their own reason
// and what to do, instead of a generic prepare failure.
func TestStrandedClaimIsReported(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := preparetest.NewClaim("stranded").Device("gpu", "gpu-1-ts-0").Build()
	client := fake.NewClientset(claim)
	rec := &events.FakeRecorder{Events: make(chan string, 10), Verbose: true}
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	d, err := Start(ctx, Options{NodeName: testNode, KubeClient: client, NVML: e.Lib, CDI: e.NewCDIHandler(t), Events: rec,
		PluginDataDir: filepath.Dir(e.CkptDir), RegistrarDir: t.TempDir(), Metrics: e.Metrics, BootIDPath: e.BootID})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	results, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	if err != nil || results[claim.UID].Err == nil {
		t.Fatalf("prepare of a device the node does not publish: %v, %v; want it to fail", err, results[claim.UID].Err)
	}
	var stranded string
	for len(rec.Events) > 0 && stranded == "" {
		if ev := <-rec.Events; strings.Contains(ev, "DeviceNotPublished") {
			stranded = ev
		}
	}
	if !strings.Contains(stranded, "ResourceClaim") || !strings.Contains(stranded, `"gpu-1-ts-0"`) || !strings.Contains(stranded, "allocated again") {
		t.Errorf("event on the stranded claim: %q; want a DeviceNotPublished warning on the ResourceClaim naming gpu-1-ts-0 and what to do", stranded)
	}
	var ready *metav1.Condition
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := client.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil || len(got.Status.Devices) == 0 {
			return false, err
		}
		for i := range got.Status.Devices[0].Conditions {
			if c := &got.Status.Devices[0].Conditions[i]; c.Type == condReady {
				ready = c
			}
		}
		return ready != nil, nil
	})
	if err != nil || ready.Status != metav1.ConditionFalse || ready.Reason != reasonDeviceNotPublished {
		t.Fatalf("Ready condition of the stranded claim's device: %+v (%v); want False/%s", ready, err, reasonDeviceNotPublished)
	}
}
