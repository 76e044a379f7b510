package plugin

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// A plugin started with a claim prepared before writes the claim's Idle
// condition Unknown/NoSamples next to Ready and Healthy (it has not seen
// the past), and renews its use Lease.
func TestStartReportsIdleUnknownAndRenewsTheUseLease(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := preparetest.NewClaim("c1").Device("gpu", "gpu-1").Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(claim)
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	started := time.Now().Add(-time.Minute)
	d, err := Start(ctx, Options{NodeName: testNode, KubeClient: client, NVML: e.Lib, CDI: e.NewCDIHandler(t),
		PluginDataDir: filepath.Dir(e.CkptDir), RegistrarDir: t.TempDir(), Metrics: e.Metrics, BootIDPath: e.BootID,
		Usage: UsageOptions{Interval: time.Hour, Namespace: "gpuaas-system", Holder: "plugin-x_1", Started: started}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	var idle *metav1.Condition
	var conditions int
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := client.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		idle = idleCondition(got)
		if len(got.Status.Devices) > 0 {
			conditions = len(got.Status.Devices[0].Conditions)
		}
		return idle != nil, nil
	})
	if err != nil {
		t.Fatalf("no Idle condition in the claim's device status: %v", err)
	}
	if idle.Status != metav1.ConditionUnknown || idle.Reason != gpuaasv1.ReasonIdleNoSamples {
		t.Errorf("Idle after the start = %s/%s, want Unknown/%s", idle.Status, idle.Reason, gpuaasv1.ReasonIdleNoSamples)
	}
	if conditions != 3 {
		t.Errorf("%d conditions on the device, want 3 (Ready, Healthy, Idle)", conditions)
	}
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		lease, err := client.CoordinationV1().Leases("gpuaas-system").Get(ctx, gpuaasv1.UseLeasePrefix+testNode, metav1.GetOptions{})
		return err == nil && *lease.Spec.HolderIdentity == "plugin-x_1" && lease.Spec.AcquireTime.Time.Equal(started), nil
	})
	if err != nil {
		t.Errorf("no use Lease held by this process: %v", err)
	}

	// A claim prepared now is tracked from its prepare, and forgotten at
	// its unprepare.
	c2 := preparetest.NewClaim("c2").Device("gpu", "gpu-2").Build()
	if _, err := client.ResourceV1().ResourceClaims(c2.Namespace).Create(ctx, c2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	results, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c2})
	if err != nil || results[c2.UID].Err != nil {
		t.Fatalf("prepare: %v, %v", err, results[c2.UID].Err)
	}
	if c, ok := d.usage.Condition(c2.UID, "gpu-2", ""); !ok || c.Reason != gpuaasv1.ReasonIdleNoSamples {
		t.Errorf("Idle of a claim just prepared = %+v, %v; want Unknown/NoSamples", c, ok)
	}
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c2.UID,
		NamespacedName: types.NamespacedName{Namespace: c2.Namespace, Name: c2.Name}}}); err != nil {
		t.Fatal(err)
	}
	if d.usage.Tracks(c2.UID) {
		t.Error("the sampler still measures an unprepared claim")
	}
}

func idleCondition(claim *resourceapi.ResourceClaim) *metav1.Condition {
	for _, dev := range claim.Status.Devices {
		for i := range dev.Conditions {
			if dev.Conditions[i].Type == gpuaasv1.DeviceConditionIdle {
				return &dev.Conditions[i]
			}
		}
	}
	return nil
}
