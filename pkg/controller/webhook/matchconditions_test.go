package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The expressions are compiled and evaluated by the apiserver's own code
// for webhook matchConditions: its CEL environment (base env set of this
// k8s version), the variables a validating webhook's conditions get, and
// its matcher with the webhook's failure policy.

var conditionCompiler = sync.OnceValue(func() plugincel.ConditionCompiler {
	return plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
})

// compileConditions compiles a webhook's conditions as the apiserver
// validates a new configuration (NewExpressions) and as it runs a stored
// one (StoredExpressions).
func compileConditions(t *testing.T, wh *admissionregv1.ValidatingWebhook) plugincel.ConditionEvaluator {
	t.Helper()
	exprs := make([]plugincel.ExpressionAccessor, 0, len(wh.MatchConditions))
	for _, mc := range wh.MatchConditions {
		exprs = append(exprs, &matchconditions.MatchCondition{Name: mc.Name, Expression: mc.Expression})
	}
	var eval plugincel.ConditionEvaluator
	for _, mode := range []environment.Type{environment.NewExpressions, environment.StoredExpressions} {
		eval = conditionCompiler().CompileCondition(exprs, plugincel.OptionalVariableDeclarations{HasAuthorizer: true}, mode)
		if errs := eval.CompilationErrors(); len(errs) > 0 {
			t.Fatalf("compiling %s's matchConditions: %v", wh.Name, errs)
		}
	}
	return eval
}

var (
	claimGVK    = resourceapi.SchemeGroupVersion.WithKind("ResourceClaim")
	templateGVK = resourceapi.SchemeGroupVersion.WithKind("ResourceClaimTemplate")
)

func createAttributes(t *testing.T, obj runtime.Object) *admission.VersionedAttributes {
	t.Helper()
	gvk := obj.GetObjectKind().GroupVersionKind()
	gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: strings.ToLower(gvk.Kind) + "s"}
	attr := admission.NewAttributesRecord(obj, nil, gvk, "team-a", "x", gvr, "", admission.Create,
		&metav1.CreateOptions{}, false, &user.DefaultInfo{Name: "alice"})
	va, err := admission.NewVersionedAttributes(attr, gvk, nil)
	if err != nil {
		t.Fatal(err)
	}
	return va
}

// sent tells whether the apiserver would call the webhook for the
// creation of obj; a condition that fails to evaluate fails the test (with
// failurePolicy Fail it would refuse the object).
func sent(t *testing.T, wh *admissionregv1.ValidatingWebhook, obj runtime.Object) bool {
	t.Helper()
	m := matchconditions.NewMatcher(compileConditions(t, wh), wh.FailurePolicy, "webhook", "validating", wh.Name)
	r := m.Match(context.Background(), createAttributes(t, obj), nil, nil)
	if r.Error != nil {
		t.Fatalf("evaluating %s's matchConditions: %v", wh.Name, r.Error)
	}
	return r.Matches
}

func exactly(class string) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: "r", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}}
}

func firstAvailable(classes ...string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: "r"}
	for i, c := range classes {
		r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{
			Name: fmt.Sprintf("s%d", i), DeviceClassName: c, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		})
	}
	return r
}

func claimSpec(reqs ...resourceapi.DeviceRequest) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
}

// Three forms of one spec: a typed claim (what the apiserver of this
// version hands a matchCondition), the same claim unstructured (older
// apiservers) and a template.
func specForms(t *testing.T, spec resourceapi.ResourceClaimSpec) map[string]runtime.Object {
	t.Helper()
	c := &resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: claimGVK.GroupVersion().String(), Kind: claimGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "x"},
		Spec:       spec,
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(c)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: templateGVK.GroupVersion().String(), Kind: templateGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "x"},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}
	return map[string]runtime.Object{"claim": c, "unstructured claim": &unstructured.Unstructured{Object: u}, "template": tmpl}
}

// conditionedConfig is the controller's configuration with the condition
// for foreign set on the claim webhooks, as the syncer would write it.
func conditionedConfig(t *testing.T, foreign []string) *admissionregv1.ValidatingWebhookConfiguration {
	t.Helper()
	cfg := validatingConfiguration(chartOwnedOptions(t), nil, nil)
	for i := range cfg.Webhooks {
		for _, wh := range conditionedWebhooks {
			if cfg.Webhooks[i].Name != wh.name {
				continue
			}
			if mc, ok := foreignCondition(wh.spec, foreign); ok {
				setMatchCondition(&cfg.Webhooks[i], &mc)
			}
		}
	}
	return cfg
}

func webhookFor(t *testing.T, cfg *admissionregv1.ValidatingWebhookConfiguration, obj runtime.Object) *admissionregv1.ValidatingWebhook {
	t.Helper()
	name := webhookClaims
	if obj.GetObjectKind().GroupVersionKind().Kind == templateGVK.Kind {
		name = webhookTemplates
	}
	for i := range cfg.Webhooks {
		if cfg.Webhooks[i].Name == name {
			return &cfg.Webhooks[i]
		}
	}
	t.Fatalf("no webhook %s", name)
	return nil
}

// A claim skips the webhook only when every request names only foreign
// classes; a class that does not exist, or one of ours, sends it.
func TestForeignConditionSendsWhatMayBeOurs(t *testing.T) {
	foreign := []string{"fpga.example.com", "nic.example.com"}
	for _, tc := range []struct {
		name    string
		foreign []string
		spec    resourceapi.ResourceClaimSpec
		sent    bool
	}{
		{"only a foreign class", foreign, claimSpec(exactly("nic.example.com")), false},
		{"foreign classes only, two requests", foreign, claimSpec(exactly("nic.example.com"), exactly("fpga.example.com")), false},
		{"one of ours", foreign, claimSpec(exactly("h100")), true},
		{"an unknown class", foreign, claimSpec(exactly("not-yet")), true},
		{"foreign and ours", foreign, claimSpec(exactly("nic.example.com"), exactly("h100")), true},
		{"firstAvailable, all foreign", foreign, claimSpec(firstAvailable("nic.example.com", "fpga.example.com")), false},
		{"firstAvailable, one unknown", foreign, claimSpec(firstAvailable("nic.example.com", "not-yet")), true},
		{"firstAvailable, one ours", foreign, claimSpec(firstAvailable("h100", "nic.example.com")), true},
		{"foreign exactly and foreign firstAvailable", foreign, claimSpec(exactly("fpga.example.com"), firstAvailable("nic.example.com")), false},
		{"a prefix of a foreign name", foreign, claimSpec(exactly("nic.example")), true},
		{"no requests", foreign, claimSpec(), true},
		{"no foreign class", nil, claimSpec(exactly("nic.example.com")), true},
	} {
		cfg := conditionedConfig(t, tc.foreign)
		for form, obj := range specForms(t, tc.spec) {
			t.Run(tc.name+"/"+form, func(t *testing.T) {
				if got := sent(t, webhookFor(t, cfg, obj), obj); got != tc.sent {
					t.Errorf("sent = %v, want %v", got, tc.sent)
				}
			})
		}
	}
}

// With no foreign class there is no condition at all: exactly the chart's
// configuration.
func TestForeignConditionAbsentWithoutForeignClasses(t *testing.T) {
	for _, wh := range conditionedWebhooks {
		if mc, ok := foreignCondition(wh.spec, nil); ok {
			t.Errorf("%s: condition %q with no foreign class", wh.name, mc.Expression)
		}
	}
	cfg := conditionedConfig(t, nil)
	for _, wh := range cfg.Webhooks {
		if len(wh.MatchConditions) > 0 {
			t.Errorf("webhook %s has matchConditions %v", wh.Name, wh.MatchConditions)
		}
	}
}

// Names are CEL string literals whatever they hold: no name can end the
// literal or the list.
func TestForeignConditionQuotesNames(t *testing.T) {
	odd := []string{`a'b`, `c"d`, `e\f`, "g\nh", `i']) || true || ['`, "é"}
	cfg := conditionedConfig(t, odd)
	for _, name := range odd {
		obj := specForms(t, claimSpec(exactly(name)))["claim"]
		if sent(t, webhookFor(t, cfg, obj), obj) {
			t.Errorf("a claim naming %q was sent", name)
		}
	}
	obj := specForms(t, claimSpec(exactly("a")))["claim"]
	if !sent(t, webhookFor(t, cfg, obj), obj) {
		t.Error("a claim naming a class not listed was not sent")
	}
}

// The longest list allowed compiles and, on the largest claim the API
// admits (32 requests of 8 subrequests each, all foreign), stays well
// within the apiserver's CEL cost limits; a longer one gives no condition.
func TestForeignConditionLimits(t *testing.T) {
	var foreign []string
	for i := 0; ; i++ {
		name := fmt.Sprintf("class-%05d.devices.example.com", i)
		if _, ok := foreignCondition("object.spec", append(foreign, name)); !ok {
			break
		}
		foreign = append(foreign, name)
	}
	mc, ok := foreignCondition("object.spec", foreign)
	if !ok || len(foreign) < 1000 {
		t.Fatalf("only %d names of %d characters fit", len(foreign), len(foreign[0]))
	}
	var reqs []resourceapi.DeviceRequest
	for i := range 32 {
		r := firstAvailable(foreign[len(foreign)-8:]...)
		r.Name = fmt.Sprintf("r%d", i)
		reqs = append(reqs, r)
	}
	obj := specForms(t, claimSpec(reqs...))["claim"]
	wh := &admissionregv1.ValidatingWebhook{Name: webhookClaims, FailurePolicy: ptr.To(admissionregv1.Fail), MatchConditions: []admissionregv1.MatchCondition{mc}}
	results, left, err := compileConditions(t, wh).ForInput(context.Background(), createAttributes(t, obj), nil,
		plugincel.OptionalVariableBindings{}, nil, celconfig.RuntimeCELCostBudgetMatchConditions)
	if err != nil || len(results) != 1 || results[0].Error != nil {
		t.Fatalf("evaluation: %v %+v", err, results)
	}
	if results[0].EvalResult.Value() != false {
		t.Errorf("the largest foreign claim was sent")
	}
	if cost := celconfig.RuntimeCELCostBudgetMatchConditions - left; cost > celconfig.PerCallLimit/10 {
		t.Errorf("evaluation cost %d, more than a tenth of the per-call limit %d", cost, celconfig.PerCallLimit)
	}
	t.Logf("%d names, %d characters, cost %d", len(foreign), len(mc.Expression), celconfig.RuntimeCELCostBudgetMatchConditions-left)

	many := make([]string, maxForeignClasses+1)
	for i := range many {
		many[i] = fmt.Sprintf("c%d", i)
	}
	if _, ok := foreignCondition("object.spec", many); ok {
		t.Errorf("a condition for %d classes", len(many))
	}
}

func foreignClassObj(name string, expr string) *resourceapi.DeviceClass {
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if expr != "" {
		dc.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
	}
	return dc
}

func chartConfig() *admissionregv1.ValidatingWebhookConfiguration {
	cfg := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultConfigName, Labels: map[string]string{"app.kubernetes.io/managed-by": "Helm"}},
	}
	for _, name := range []string{webhookClaims, webhookTemplates, "gpuprofiles.gpuaas.io"} {
		cfg.Webhooks = append(cfg.Webhooks, admissionregv1.ValidatingWebhook{
			Name: name, FailurePolicy: ptr.To(admissionregv1.Fail), ClientConfig: admissionregv1.WebhookClientConfig{CABundle: []byte("CA")},
		})
	}
	// An administrator's own condition is kept.
	cfg.Webhooks[0].MatchConditions = []admissionregv1.MatchCondition{{Name: "example.com/mine", Expression: "true"}}
	return cfg
}

func liveConfig(t *testing.T, c client.Client) *admissionregv1.ValidatingWebhookConfiguration {
	t.Helper()
	var cfg admissionregv1.ValidatingWebhookConfiguration
	if err := c.Get(ctx(t), client.ObjectKey{Name: DefaultConfigName}, &cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

// ourCondition is the expression of our condition on each webhook ("" for
// none), checking that nothing else changed.
func ourCondition(t *testing.T, cfg *admissionregv1.ValidatingWebhookConfiguration) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, wh := range cfg.Webhooks {
		if string(wh.ClientConfig.CABundle) != "CA" || *wh.FailurePolicy != admissionregv1.Fail {
			t.Errorf("webhook %s changed beyond its matchConditions: %+v", wh.Name, wh)
		}
		for _, mc := range wh.MatchConditions {
			if mc.Name == foreignConditionName {
				out[wh.Name] = mc.Expression
			}
		}
	}
	if len(cfg.Webhooks[0].MatchConditions) == 0 || cfg.Webhooks[0].MatchConditions[0].Name != "example.com/mine" {
		t.Errorf("the administrator's condition is gone: %v", cfg.Webhooks[0].MatchConditions)
	}
	return out
}

func listsClass(expr, class string) bool { return strings.Contains(expr, fmt.Sprintf("%q", class)) }

// The syncer writes the condition into the live configuration, follows
// the classes, and takes a class off before the controller renders it.
func TestMatchConditionSyncerKeepsLiveConfig(t *testing.T) {
	objs := append(world(t), chartConfig(), foreignClassObj("nic.example.com", `device.driver == "nic.example.com"`))
	acct, c := newAccountant(t, objs...)
	s := NewMatchConditionSyncer(c, acct.ForeignClasses, chartOwnedOptions(t).ConfigName, 30*time.Second)
	if err := s.sync(ctx(t), ""); err != nil {
		t.Fatal(err)
	}
	got := ourCondition(t, liveConfig(t, c))
	if len(got) != 2 || !listsClass(got[webhookClaims], "nic.example.com") || !listsClass(got[webhookTemplates], "nic.example.com") ||
		listsClass(got[webhookClaims], "h100") {
		t.Fatalf("conditions %v", got)
	}
	if !strings.Contains(got[webhookTemplates], "object.spec.spec.devices.requests") {
		t.Errorf("the template condition reads %q", got[webhookTemplates])
	}
	rv := liveConfig(t, c).ResourceVersion
	if err := s.sync(ctx(t), ""); err != nil || liveConfig(t, c).ResourceVersion != rv {
		t.Errorf("a sync with nothing new wrote the configuration (%v)", err)
	}

	// A second foreign class joins the list.
	if err := c.Create(ctx(t), foreignClassObj("fpga.example.com", `device.driver == "fpga.example.com"`)); err != nil {
		t.Fatal(err)
	}
	acct.InvalidateCatalog()
	if err := s.sync(ctx(t), ""); err != nil {
		t.Fatal(err)
	}
	if got := ourCondition(t, liveConfig(t, c)); !listsClass(got[webhookClaims], "fpga.example.com") {
		t.Fatalf("fpga.example.com not listed: %v", got)
	}

	// Excluded before the controller makes it ours.
	if err := s.Exclude(ctx(t), "fpga.example.com"); err != nil {
		t.Fatal(err)
	}
	if got := ourCondition(t, liveConfig(t, c)); listsClass(got[webhookClaims], "fpga.example.com") || !listsClass(got[webhookClaims], "nic.example.com") {
		t.Fatalf("after Exclude: %v", got)
	}

	// No foreign class left: no condition.
	for _, n := range []string{"nic.example.com", "fpga.example.com"} {
		if err := c.Delete(ctx(t), &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	acct.InvalidateCatalog()
	if err := s.sync(ctx(t), ""); err != nil {
		t.Fatal(err)
	}
	if got := ourCondition(t, liveConfig(t, c)); len(got) != 0 {
		t.Fatalf("conditions left: %v", got)
	}
}

// When the list cannot be computed the condition goes: every claim is sent.
func TestMatchConditionSyncerFailsOpenToTheWebhook(t *testing.T) {
	cfg := chartConfig()
	mc, _ := foreignCondition("object.spec", []string{"nic.example.com"})
	setMatchCondition(&cfg.Webhooks[0], &mc)
	c := newFakeClient(t, cfg)
	s := &MatchConditionSyncer{client: c, configName: DefaultConfigName, resync: time.Minute, kick: make(chan struct{}, 1),
		foreign: func(context.Context) ([]string, error) { return nil, errors.New("cache gone") }}
	if err := s.sync(ctx(t), ""); err == nil {
		t.Fatal("no error")
	}
	if got := ourCondition(t, liveConfig(t, c)); len(got) != 0 {
		t.Fatalf("conditions left: %v", got)
	}
	// Exclude of a configuration not installed (yet) has nothing to do.
	s = &MatchConditionSyncer{client: newFakeClient(t), configName: DefaultConfigName,
		foreign: func(context.Context) ([]string, error) { return []string{"nic.example.com"}, nil }}
	if err := s.Exclude(ctx(t), "x"); err != nil {
		t.Fatalf("Exclude without a configuration: %v", err)
	}
}

// The running syncer writes at start and after a kick.
func TestMatchConditionSyncerRuns(t *testing.T) {
	c := newFakeClient(t, chartConfig())
	var mu sync.Mutex
	foreign := []string{"nic.example.com"}
	s := &MatchConditionSyncer{client: c, configName: DefaultConfigName, resync: time.Hour, kick: make(chan struct{}, 1),
		foreign: func(context.Context) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), foreign...), nil
		}}
	runCtx, cancel := context.WithCancel(ctx(t))
	done := make(chan error, 1)
	go func() { done <- s.Start(runCtx) }()
	waitFor := func(class string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !listsClass(ourCondition(t, liveConfig(t, c))[webhookClaims], class) {
			if time.Now().After(deadline) {
				t.Fatalf("%s never listed", class)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("nic.example.com")
	mu.Lock()
	foreign = append(foreign, "fpga.example.com")
	mu.Unlock()
	s.Kick()
	waitFor("fpga.example.com")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The controller's own configuration (not the chart's) keeps the condition
// when a replica starting rewrites it.
func TestRegistrarKeepsMatchConditions(t *testing.T) {
	o := &Options{ServiceNamespace: "gpuaas", ServiceName: "ctrl"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	live := validatingConfiguration(o, nil, []byte("CA"))
	mc, _ := foreignCondition("object.spec", []string{"nic.example.com"})
	setMatchCondition(&live.Webhooks[0], &mc)
	c := newFakeClient(t, live)
	r := &Registrar{client: c, opts: o, caBundle: []byte("CA"), started: func(*http.Request) error { return nil }}
	if err := r.apply(ctx(t)); err != nil {
		t.Fatal(err)
	}
	got := liveConfig(t, c)
	if len(got.Webhooks[0].MatchConditions) != 1 || got.Webhooks[0].MatchConditions[0] != mc {
		t.Fatalf("matchConditions after apply: %v", got.Webhooks[0].MatchConditions)
	}
}
