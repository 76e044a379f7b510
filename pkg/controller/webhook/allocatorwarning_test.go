package webhook

import (
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clientgotesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// migRequests are n requests of one MIG device each, named mig-0...
func migRequests(n int) []resourceapi.DeviceRequest {
	var out []resourceapi.DeviceRequest
	for i := range n {
		out = append(out, resourceapi.DeviceRequest{Name: "mig-" + string(rune('0'+i)),
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "mig.gpuaas.io"}})
	}
	return out
}

func sameParent(requests ...string) []resourceapi.DeviceConstraint {
	return []resourceapi.DeviceConstraint{{Requests: requests, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("gpu.gpuaas.io/parentUUID"))}}
}

// Issue 35: the scheduler of 1.34 and 1.35 may keep a claim pending whose
// matchAttribute constraint spans several devices; the webhook warns on
// those versions only, and only for such claims.
func TestRejectedCountersWarning(t *testing.T) {
	fourMIGs := resourceapi.DeviceClaim{Requests: migRequests(4), Constraints: sameParent()}
	oneMIG := resourceapi.DeviceClaim{Requests: migRequests(1), Constraints: sameParent()}
	twoUnconstrained := resourceapi.DeviceClaim{Requests: migRequests(2)}
	twoOfThree := resourceapi.DeviceClaim{Requests: migRequests(3), Constraints: sameParent("mig-0", "mig-2")}
	oneOfThree := resourceapi.DeviceClaim{Requests: migRequests(3), Constraints: sameParent("mig-1")}
	all := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io", AllocationMode: resourceapi.DeviceAllocationModeAll}}},
		Constraints: sameParent()}
	alternatives := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "migs", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "one", DeviceClassName: "mig.gpuaas.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		{Name: "three", DeviceClassName: "mig.gpuaas.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 3},
	}}}, Constraints: sameParent("migs/three")}
	for _, tc := range []struct {
		name   string
		minor  int
		claim  resourceapi.DeviceClaim
		warned bool
	}{
		{"four MIG devices of one GPU on 1.34", 34, fourMIGs, true},
		{"four MIG devices of one GPU on 1.35", 35, fourMIGs, true},
		{"fixed in 1.36", 36, fourMIGs, false},
		{"1.37", 37, fourMIGs, false},
		{"version not known yet", 0, fourMIGs, false},
		{"one device: nothing to reject", 34, oneMIG, false},
		{"no constraint", 34, twoUnconstrained, false},
		{"constraint over two of three requests", 35, twoOfThree, true},
		{"constraint over one of three requests", 35, oneOfThree, false},
		{"every matching device", 34, all, true},
		{"a subrequest of three devices", 34, alternatives, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rejectedCountersWarning(tc.minor, tc.claim)
			if (got != "") != tc.warned {
				t.Fatalf("warning %q, want one: %v", got, tc.warned)
			}
			if tc.warned && (!strings.Contains(got, "1.36") || !strings.Contains(got, "gpu.gpuaas.io/parentUUID") || !strings.Contains(got, "Pin the GPU")) {
				t.Errorf("warning %q does not say the attribute, the fix and the workaround", got)
			}
		})
	}
}

func TestServerMinorFollowsDiscovery(t *testing.T) {
	fake := &fakediscovery.FakeDiscovery{Fake: &clientgotesting.Fake{}}
	s := &serverMinor{discovery: fake}
	logger := klog.Background()
	if s.get() != 0 {
		t.Fatalf("minor %d before any answer, want 0 (unknown)", s.get())
	}
	fake.FakedServerVersion = &version.Info{Major: "1", Minor: "35+", GitVersion: "v1.35.4-eks"}
	s.refresh(logger)
	if s.get() != 35 {
		t.Fatalf("minor %d from %q, want 35", s.get(), "35+")
	}
	fake.PrependReactor("get", "version", func(clientgotesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	s.refresh(logger)
	if s.get() != 35 {
		t.Fatalf("minor %d after a failed read, want the last one, 35", s.get())
	}
	var none *serverMinor
	if none.get() != 0 {
		t.Fatal("a webhook without a server version must not warn")
	}
}

// The user sees the warning where they create the object: a template (its
// claims are made by the kube-controller-manager) or a claim.
func TestWebhooksWarnOnOldSchedulers(t *testing.T) {
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	server := &serverMinor{}
	server.minor.Store(34)
	devices := resourceapi.DeviceClaim{Requests: migRequests(4), Constraints: sameParent()}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "four-migs", Namespace: "a"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: devices}}}
	th := &templateWebhook{decoder: admission.NewDecoder(s), server: server}
	resp := th.Handle(ctx(t), request(t, admissionv1.Create, "a", tmpl.Name, tmpl))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "Kubernetes 1.34") {
		t.Fatalf("template on 1.34: allowed %v, warnings %q; want allowed with the warning", resp.Allowed, resp.Warnings)
	}
	server.minor.Store(36)
	if resp := th.Handle(ctx(t), request(t, admissionv1.Create, "a", tmpl.Name, tmpl)); !resp.Allowed || len(resp.Warnings) != 0 {
		t.Fatalf("template on 1.36: allowed %v, warnings %q; want no warning", resp.Allowed, resp.Warnings)
	}

	server.minor.Store(35)
	acct, _ := newAccountant(t, world(t)...)
	ch, _ := newClaimWebhook(t, acct)
	ch.server = server
	ch.exempt = sets.New("a") // admitted without a quota
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "four-migs", Namespace: "a"}, Spec: resourceapi.ResourceClaimSpec{Devices: devices}}
	resp = ch.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "Kubernetes 1.35") {
		t.Fatalf("claim on 1.35: allowed %v, warnings %q; want allowed with the warning", resp.Allowed, resp.Warnings)
	}
}
