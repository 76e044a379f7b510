package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

func request(t testing.TB, op admissionv1.Operation, namespace, name string, obj runtime.Object) admission.Request {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: types.UID("req-" + name), Operation: op, Namespace: namespace, Name: name,
		Object: runtime.RawExtension{Raw: raw},
	}}
}

func newClaimWebhook(t testing.TB, acct *quotaadmission.Accountant) (*claimWebhook, *events.FakeRecorder) {
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(10)
	return &claimWebhook{acct: acct, decoder: admission.NewDecoder(s), recorder: rec, nudger: quotaadmission.NewNudger(nil, true)}, rec
}

func withConfig(c *resourceapi.ResourceClaim, raw string) *resourceapi.ResourceClaim {
	c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(raw)}},
	}}}
	return c
}

func TestClaimWebhook(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"),
		allocatedTo(claim("a", "old", "h100", 1), "node-a", "gpu-0"))...)
	h, rec := newClaimWebhook(t, acct)

	t.Run("over quota: denied, the pod told why and remembered", func(t *testing.T) {
		c := ownedByPod(claim("a", "pod-gpu-x1", "h100", 1), "trainer")
		resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
		if resp.Allowed || !strings.Contains(resp.Result.Message, `TenantQuota "team-a" exceeded`) || resp.Result.Code != http.StatusForbidden {
			t.Fatalf("response = %+v", resp.Result)
		}
		select {
		case e := <-rec.Events:
			if !strings.Contains(e, reasonQuotaExceeded) || !strings.Contains(e, "limit 1") {
				t.Errorf("event %q", e)
			}
		default:
			t.Error("no event for the pod")
		}
		if !h.nudger.Waits(types.NamespacedName{Namespace: "a", Name: "trainer"}) {
			t.Error("pod not remembered for a retry")
		}
	})
	t.Run("strict opaque config: unknown field named", func(t *testing.T) {
		c := withConfig(claim("a", "typo", "mig-1g", 1), `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"MigConfig","sharring":{}}`)
		resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
		if resp.Allowed || resp.Result.Code != http.StatusUnprocessableEntity ||
			!strings.Contains(resp.Result.Message, `unknown field "sharring"`) ||
			!strings.Contains(resp.Result.Message, "spec.devices.config[0].opaque.parameters") {
			t.Fatalf("response = %+v", resp.Result)
		}
	})
	t.Run("another driver's config is not ours to judge", func(t *testing.T) {
		c := withConfig(claim("b", "nic", "nic", 1), `{"whatever":1}`)
		c.Spec.Devices.Config[0].Opaque.Driver = "nic.example.com"
		if resp := h.Handle(ctx(t), request(t, admissionv1.Create, "b", c.Name, c)); !resp.Allowed {
			t.Fatalf("denied: %+v", resp.Result)
		}
	})
	// Issue 12 item 6: any namespace starting with "kube-" was exempt, so
	// a tenant escaped quota by naming its namespace kube-anything.
	t.Run("exactly the listed namespaces are exempt", func(t *testing.T) {
		objs := append(world(t), ns("kube-gpu", nil), ns("kube-system", nil), ns("batch", nil),
			teamQuota("sys", "kube-gpu", "0"), teamQuota("sys2", "kube-system", "0"), teamQuota("ops", "batch", "0"))
		acctExempt, _ := newAccountant(t, objs...)
		hx, _ := newClaimWebhook(t, acctExempt)
		hx.exempt = sets.New(exemptNamespaces([]string{"batch"})...)
		for ns, exempt := range map[string]bool{"kube-gpu": false, "kube-system": true, "batch": true} {
			c := claim(ns, "x", "h100", 1)
			if resp := hx.Handle(ctx(t), request(t, admissionv1.Create, ns, c.Name, c)); resp.Allowed != exempt {
				t.Errorf("claim in %s: allowed %v, want %v (%+v)", ns, resp.Allowed, exempt, resp.Result)
			}
		}
	})
}

// Claims from templates have generated names: the admission request has no
// name, the object has. The reservation must be keyed by the object's
// name, or the claim would count twice once the cache shows it.
func TestClaimWebhookGeneratedName(t *testing.T) {
	acct, c := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"))...)
	h, _ := newClaimWebhook(t, acct)
	claimObj := ownedByPod(claim("a", "pod-gpu-abcde", "h100", 1), "pod")
	req := request(t, admissionv1.Create, "a", "", claimObj)
	if resp := h.Handle(ctx(t), req); !resp.Allowed {
		t.Fatalf("denied: %+v", resp.Result)
	}
	if err := c.Create(ctx(t), claimObj); err != nil {
		t.Fatal(err)
	}
	rep, err := acct.Report(ctx(t), "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Usage.Claims != 1 || rep.Usage.Reserved.Units.String() != "1" {
		t.Fatalf("claims %d, reserved %s: counted twice?", rep.Usage.Claims, rep.Usage.Reserved.Units)
	}
}

func TestClaimWebhookWarnsWhenBorrowing(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), ns("b", nil),
		tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research", Limits: gpuaas.QuotaLimits{GpuUnits: qty("0")}}),
		tenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b"}, Cohort: "research", Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}}))...)
	h, _ := newClaimWebhook(t, acct)
	c := claim("a", "borrow", "h100", 1)
	resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], `cohort "research"`) {
		t.Fatalf("response = %+v, warnings %q", resp.Result, resp.Warnings)
	}
}

func TestTemplateWebhook(t *testing.T) {
	s, _ := testworld.Scheme()
	h := &templateWebhook{decoder: admission.NewDecoder(s)}
	good := &resourceapi.ResourceClaimTemplate{Spec: resourceapi.ResourceClaimTemplateSpec{Spec: withConfig(claim("a", "t", "h100", 1),
		`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`).Spec}}
	if resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", "t", good)); !resp.Allowed {
		t.Fatalf("good template denied: %+v", resp.Result)
	}
	bad := good.DeepCopy()
	bad.Spec.Spec.Devices.Config[0].Opaque.Parameters.Raw = []byte(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Spatial"}}`)
	resp := h.Handle(ctx(t), request(t, admissionv1.Update, "a", "t", bad))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "spec.spec.devices.config[0]") || !strings.Contains(resp.Result.Message, "Spatial") {
		t.Fatalf("bad template: %+v", resp.Result)
	}
}

func TestProfileAndQuotaWebhooks(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"))...)
	s, _ := testworld.Scheme()
	dec := admission.NewDecoder(s)
	ph, qh := &profileWebhook{acct: acct, decoder: dec}, &quotaWebhook{acct: acct, decoder: dec}

	bad := gpuProfile("bad", gpuaas.ProfileSelector{CEL: "device.nope"})
	if resp := ph.Handle(ctx(t), request(t, admissionv1.Create, "", "bad", bad)); resp.Allowed || !strings.Contains(resp.Result.Message, "spec.selector.cel") {
		t.Fatalf("bad profile: %+v", resp.Result)
	}
	good := gpuProfile("good", gpuaas.ProfileSelector{MigProfile: "3g.40gb"})
	if resp := ph.Handle(ctx(t), request(t, admissionv1.Create, "", "good", good)); !resp.Allowed {
		t.Fatalf("good profile: %+v", resp.Result)
	}
	neg := teamQuota("neg", "x", "-2")
	if resp := qh.Handle(ctx(t), request(t, admissionv1.Create, "", "neg", neg)); resp.Allowed || !strings.Contains(resp.Result.Message, "must not be negative") {
		t.Fatalf("negative quota: %+v", resp.Result)
	}
	dup := teamQuota("dup", "a", "5")
	resp := qh.Handle(ctx(t), request(t, admissionv1.Create, "", "dup", dup))
	if !resp.Allowed || len(resp.Warnings) == 0 || !strings.Contains(resp.Warnings[0], `namespace a is already charged to TenantQuota "team-a"`) {
		t.Fatalf("overlapping quota: %+v warnings %q", resp.Result, resp.Warnings)
	}
}

// An invalid profile stored while no webhook ran must still take the
// controller's finalizer: the webhook refused every update of it, the
// finalizer patch failed forever and the profile's status was never
// written. Spec changes are still validated.
func TestProfileWebhookValidatesOnlySpecChanges(t *testing.T) {
	acct, _ := newAccountant(t, world(t)...)
	s, _ := testworld.Scheme()
	ph := &profileWebhook{acct: acct, decoder: admission.NewDecoder(s)}
	stored := gpuProfile("bad", gpuaas.ProfileSelector{CEL: "device.nope"})
	withFinalizer := stored.DeepCopy()
	withFinalizer.Finalizers = []string{gpuaas.DrainFinalizer}
	req := request(t, admissionv1.Update, "", "bad", withFinalizer)
	req.OldObject = request(t, admissionv1.Update, "", "bad", stored).Object
	if resp := ph.Handle(ctx(t), req); !resp.Allowed {
		t.Fatalf("finalizer on an invalid profile refused: %+v", resp.Result)
	}
	changed := withFinalizer.DeepCopy()
	changed.Spec.Selector.CEL = "device.still.nope"
	req = request(t, admissionv1.Update, "", "bad", changed)
	req.OldObject = request(t, admissionv1.Update, "", "bad", stored).Object
	if resp := ph.Handle(ctx(t), req); resp.Allowed {
		t.Fatal("an invalid spec change was allowed")
	}
}

// shapeGate refuses every claim named "refused".
type shapeGate struct{}

func (shapeGate) Refuse(_ context.Context, c *resourceapi.ResourceClaim) (string, error) {
	if c.Name == "refused" {
		return "unavailable: shape h100-slot has 0 placeable (0 of 3 nodes have a free GPU+NIC on one PCIe root)", nil
	}
	return "", nil
}

// TestClaimWebhookRefusesUnavailableShape: a claim the shape gate refuses
// is denied with its message, before quota (nothing is charged), and its
// pod is told why; other claims go on to quota.
func TestClaimWebhookRefusesUnavailableShape(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"))...)
	h, rec := newClaimWebhook(t, acct)
	h.shapes = shapeGate{}
	c := ownedByPod(claim("a", "refused", "h100", 1), "trainer")
	resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
	want := "unavailable: shape h100-slot has 0 placeable (0 of 3 nodes have a free GPU+NIC on one PCIe root)"
	if resp.Allowed || resp.Result.Message != want || resp.Result.Code != http.StatusForbidden {
		t.Fatalf("response = %+v", resp.Result)
	}
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, reasonShapeUnavailable) || !strings.Contains(e, want) {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no event for the pod")
	}
	// The refused claim reserved nothing: a claim of the whole quota fits.
	ok := claim("a", "ok", "h100", 1)
	if resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", ok.Name, ok)); !resp.Allowed {
		t.Fatalf("claim after a refusal denied: %+v", resp.Result)
	}
}

// A negative price made the cost counters go down; the recorder ignored it
// and logged, so the admin learned of it from the controller's log at
// best. The webhook refuses it, naming the field.
func TestProfileWebhookRefusesNegativePrice(t *testing.T) {
	acct, _ := newAccountant(t, world(t)...)
	s, _ := testworld.Scheme()
	ph := &profileWebhook{acct: acct, decoder: admission.NewDecoder(s)}
	for price, allowed := range map[string]bool{"-0.50": false, "0": true, "2.5": true} {
		p := gpuProfile("priced", gpuaas.ProfileSelector{MigProfile: "3g.40gb"})
		p.Spec.Price = &gpuaas.Price{PerGpuUnitHour: resource.MustParse(price)}
		resp := ph.Handle(ctx(t), request(t, admissionv1.Create, "", p.Name, p))
		if resp.Allowed != allowed {
			t.Errorf("price %s: allowed %v, want %v (%+v)", price, resp.Allowed, allowed, resp.Result)
		}
		if !allowed && (resp.Result == nil || !strings.Contains(resp.Result.Message, "spec.price.perGpuUnitHour") ||
			!strings.Contains(resp.Result.Message, "must not be negative")) {
			t.Errorf("price %s: the refusal does not name the field: %+v", price, resp.Result)
		}
	}
}
