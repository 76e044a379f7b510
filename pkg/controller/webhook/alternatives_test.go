package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// withAlternatives is a claim whose one request "gpu" asks for the first
// available of classes, alternatives named alt-<class>.
func alternativeNames(c *resourceapi.ResourceClaim) []string {
	var out []string
	for _, s := range c.Spec.Devices.Requests[0].FirstAvailable {
		out = append(out, s.Name)
	}
	return out
}

func TestTrimAlternatives(t *testing.T) {
	c := withAlternatives("a", "c", "big", "small", "tiny")
	c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, withAlternatives("a", "c", "nic-a", "nic-b").Spec.Devices.Requests[0])
	c.Spec.Devices.Requests[1].Name = "nic"
	c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{
		{Requests: []string{"gpu/alt-big"}},                 // only a dropped one: goes
		{Requests: []string{"gpu/alt-big", "gpu/alt-tiny"}}, // loses one name
		{},                                 // every request: stays
		{Requests: []string{"gpu", "nic"}}, // parents: stay
	}
	c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{
		{Requests: []string{"gpu/alt-big"}},
		{Requests: []string{"gpu/alt-small"}},
	}
	dropped := trimAlternatives(&c.Spec, func(req string, sub *resourceapi.DeviceSubRequest) bool {
		return sub.DeviceClassName == "big" || req == "nic" // all of nic's: none may go
	})
	if !slices.Equal(dropped, []string{"gpu/alt-big"}) {
		t.Errorf("dropped %v, want [gpu/alt-big]", dropped)
	}
	if got := alternativeNames(c); !slices.Equal(got, []string{"alt-small", "alt-tiny"}) {
		t.Errorf("gpu's alternatives %v", got)
	}
	if n := len(c.Spec.Devices.Requests[1].FirstAvailable); n != 2 {
		t.Errorf("nic kept %d alternatives, want both: a request never loses its last", n)
	}
	var constraints [][]string
	for _, k := range c.Spec.Devices.Constraints {
		constraints = append(constraints, k.Requests)
	}
	want := [][]string{{"gpu/alt-tiny"}, nil, {"gpu", "nic"}}
	if !slices.EqualFunc(constraints, want, slices.Equal) {
		t.Errorf("constraints name %q, want %q", constraints, want)
	}
	if len(c.Spec.Devices.Config) != 1 || !slices.Equal(c.Spec.Devices.Config[0].Requests, []string{"gpu/alt-small"}) {
		t.Errorf("configs %+v, want only the one naming gpu/alt-small", c.Spec.Devices.Config)
	}

	untouched := withAlternatives("a", "c", "big", "huge")
	if dropped := trimAlternatives(&untouched.Spec, func(string, *resourceapi.DeviceSubRequest) bool { return true }); dropped != nil {
		t.Errorf("dropped %v when no alternative fits; the claim must keep its shape", dropped)
	}
}

// Issue 12 item 9: a tenant that may have no H100 asked for "an H100, or
// else a MIG 1g" and was always denied: the claim was charged for its
// most expensive alternative. The alternatives webhook drops the H100, and
// the quota webhook then admits the claim.
func TestAlternativesWebhookLetsQuotaAdmitTheOthers(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), ns("system", nil),
		tenantQuota("no-h100", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("8"), Devices: map[string]int64{"h100": 0}}}))...)
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	trimmer := &alternativesWebhook{exempt: sets.New("system"), acct: acct, decoder: admission.NewDecoder(s)}
	quotaHook, _ := newClaimWebhook(t, acct)

	c := withAlternatives("a", "h100-or-1g", "h100", "mig-1g")
	if resp := quotaHook.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c)); resp.Allowed {
		t.Fatal("the untrimmed claim was admitted: it may get an H100 the tenant may not have")
	}
	droppedBefore := testutil.ToFloat64(alternativesDropped.WithLabelValues("no-h100"))
	resp := trimmer.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
	if !resp.Allowed || len(resp.Patches) != 1 || resp.Patches[0].Path != "/spec/devices" {
		t.Fatalf("response %+v, patches %+v: want the claim's devices replaced", resp.Result, resp.Patches)
	}
	if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], `gpu/alt-h100: `) || !strings.Contains(resp.Warnings[0], "limit 0") {
		t.Errorf("warnings %q: want the dropped alternative and why", resp.Warnings)
	}
	raw, _ := json.Marshal(resp.Patches[0].Value)
	if err := json.Unmarshal(raw, &c.Spec.Devices); err != nil {
		t.Fatal(err)
	}
	if got := alternativeNames(c); !slices.Equal(got, []string{"alt-mig-1g"}) {
		t.Fatalf("alternatives left %v, want [alt-mig-1g]", got)
	}
	if resp := quotaHook.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c)); !resp.Allowed {
		t.Errorf("the trimmed claim was denied: %+v", resp.Result)
	}
	if got := testutil.ToFloat64(alternativesDropped.WithLabelValues("no-h100")) - droppedBefore; got != 1 {
		t.Errorf("gpuaas_claim_alternatives_dropped_total{tenant=no-h100} grew by %v, want 1", got)
	}

	none := withAlternatives("a", "none", "h100", "h100")
	none.Spec.Devices.Requests[0].FirstAvailable[1].Name = "alt-h100-again"
	for name, tc := range map[string]struct {
		claim *resourceapi.ResourceClaim
		op    admissionv1.Operation
	}{
		"every alternative fits":         {withAlternatives("a", "fits", "mig-1g", "mig-1g-again"), admissionv1.Create},
		"no alternative fits":            {none, admissionv1.Create},
		"exempt namespace":               {withAlternatives("system", "sys", "h100", "mig-1g"), admissionv1.Create},
		"not a create":                   {withAlternatives("a", "upd", "h100", "mig-1g"), admissionv1.Update},
		"one alternative: nothing to do": {withAlternatives("a", "one", "h100"), admissionv1.Create},
	} {
		resp := trimmer.Handle(ctx(t), request(t, tc.op, tc.claim.Namespace, tc.claim.Name, tc.claim))
		if !resp.Allowed || len(resp.Patches) != 0 {
			t.Errorf("%s: response %+v, patches %+v: want allowed unchanged", name, resp.Result, resp.Patches)
		}
	}
	// A refusal from this webhook would refuse the claim: its
	// failurePolicy covers failed calls only.
	garbled := request(t, admissionv1.Create, "a", "garbled", c)
	garbled.Object.Raw = []byte(`{"spec": 7}`)
	if resp := trimmer.Handle(ctx(t), garbled); !resp.Allowed {
		t.Errorf("an undecodable claim was refused: %+v", resp.Result)
	}
}

// Issue 55 route 4: the alternatives webhook priced a dry run's
// alternatives on the unmarked request context, so two `kubectl create
// --dry-run=server` of heavy alternatives held the claims' pricing slots.
// A dry run's alternatives are priced in the dry runs' slots: here the
// claims' slots are never free, and the dry run is judged all the same
// (the H100 it may not have dropped, for its limit).
func TestAlternativesWebhookPricesADryRunAsADryRun(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil),
		tenantQuota("no-h100", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("8"), Devices: map[string]int64{"h100": 0}}}))...)
	acct.SetPricingSlots(quota.NewPricingSlots(0, 1)) // the claims' slots are all taken
	trimmer := newAlternativesWebhook(t, acct)
	req := request(t, admissionv1.Create, "a", "dry", withAlternatives("a", "dry", "h100", "mig-1g"))
	req.DryRun = ptr.To(true)
	reqCtx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	defer cancel()
	resp := trimmer.Handle(reqCtx, req)
	if !resp.Allowed || len(resp.Patches) != 1 || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "gpu/alt-h100: ") ||
		!strings.Contains(resp.Warnings[0], "limit 0") {
		t.Fatalf("dry run: response %+v, patches %+v, warnings %q; want the H100 dropped for its limit", resp.Result, resp.Patches, resp.Warnings)
	}
}

// Issue 55 route 4: each alternative of a claim was priced within a CEL
// budget of its own, so eight alternatives spent eight claims' budgets.
// All alternatives of one claim are priced under one: here each alone is
// within it, together they are not, and those past it are dropped as too
// costly to evaluate.
func TestAlternativesWebhookPricesAllAlternativesUnderOneBudget(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "8"))...)
	trimmer := newAlternativesWebhook(t, acct)
	c := withAlternatives("a", "heavy", "h100", "h100", "h100", "h100", "h100", "h100", "h100", "h100")
	for i := range c.Spec.Devices.Requests[0].FirstAvailable {
		sub := &c.Spec.Devices.Requests[0].FirstAvailable[i]
		sub.Name = fmt.Sprintf("alt-%d", i)
		sub.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: heavySelector(60, i)}}}
	}
	resp := trimmer.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "cost more to evaluate") {
		t.Fatalf("response %+v, warnings %q; want alternatives dropped for the claim's CEL budget", resp.Result, resp.Warnings)
	}
}

// heavySelector is a nested comprehension every device evaluates in full,
// inner times 700 iterations (with inner 100, about half the API server's
// cost limit for one expression); salt makes each a new shape.
func heavySelector(inner, salt int) string {
	outer := make([]string, 700)
	for i := range outer {
		outer[i] = fmt.Sprint(i)
	}
	return fmt.Sprintf("[%s].all(x, [%s].all(y, x + y >= %d))", strings.Join(outer, ","), strings.Join(outer[:inner], ","), -salt)
}

func newAlternativesWebhook(t testing.TB, acct *quotaadmission.Accountant) *alternativesWebhook {
	t.Helper()
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return &alternativesWebhook{exempt: sets.New[string](), acct: acct, decoder: admission.NewDecoder(s)}
}
