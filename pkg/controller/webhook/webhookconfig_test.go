package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func chartOwnedOptions(t *testing.T) *Options {
	t.Helper()
	o := &Options{ServiceNamespace: "gpuaas", ServiceName: "ctrl", ConfigOwnedByChart: true}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

// With the chart owning the configuration, the controller never creates it:
// one it created outlived helm uninstall and refused every claim.
func TestChartOwnedWebhookConfigIsNeverCreated(t *testing.T) {
	c := newFakeClient(t)
	r := &Registrar{client: c, opts: chartOwnedOptions(t), caBundle: []byte("CA")}
	if err := r.apply(context.Background()); err == nil {
		t.Fatal("apply succeeded without the chart's configuration")
	}
	for _, got := range []client.Object{&admissionregv1.ValidatingWebhookConfiguration{}, &admissionregv1.MutatingWebhookConfiguration{}} {
		err := c.Get(context.Background(), client.ObjectKey{Name: DefaultConfigName}, got)
		if !apierrors.IsNotFound(err) {
			t.Fatalf("the controller created the %T (get: %v)", got, err)
		}
	}
}

// chartMutating is the chart's mutating configuration as helm installs it.
func chartMutating() *admissionregv1.MutatingWebhookConfiguration {
	return &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultConfigName},
		Webhooks:   []admissionregv1.MutatingWebhook{{Name: webhookAlternatives, FailurePolicy: ptr.To(admissionregv1.Ignore)}},
	}
}

// The controller injects its CA into every webhook of the chart's
// configuration and changes nothing else.
func TestChartOwnedWebhookConfigGetsCABundle(t *testing.T) {
	chart := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultConfigName, Labels: map[string]string{"app.kubernetes.io/managed-by": "Helm"}},
		Webhooks: []admissionregv1.ValidatingWebhook{
			{Name: "a.gpuaas.io", FailurePolicy: ptr.To(admissionregv1.Fail), TimeoutSeconds: ptr.To[int32](7)},
			{Name: "b.gpuaas.io", FailurePolicy: ptr.To(admissionregv1.Ignore), ClientConfig: admissionregv1.WebhookClientConfig{CABundle: []byte("OLD")}},
		},
	}
	c := newFakeClient(t, chart, chartMutating())
	r := &Registrar{client: c, opts: chartOwnedOptions(t), caBundle: []byte("CA")}
	if err := r.apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	var mutating admissionregv1.MutatingWebhookConfiguration
	if err := c.Get(context.Background(), client.ObjectKey{Name: DefaultConfigName}, &mutating); err != nil {
		t.Fatal(err)
	}
	if string(mutating.Webhooks[0].ClientConfig.CABundle) != "CA" || *mutating.Webhooks[0].FailurePolicy != admissionregv1.Ignore {
		t.Errorf("mutating webhook %+v: want the CA injected and nothing else changed", mutating.Webhooks[0])
	}
	var got admissionregv1.ValidatingWebhookConfiguration
	if err := c.Get(context.Background(), client.ObjectKey{Name: DefaultConfigName}, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Webhooks) != 2 || got.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Fatalf("configuration changed beyond the CA: %+v", got)
	}
	for _, wh := range got.Webhooks {
		if string(wh.ClientConfig.CABundle) != "CA" {
			t.Errorf("webhook %s caBundle %q, want CA", wh.Name, wh.ClientConfig.CABundle)
		}
	}
	if *got.Webhooks[0].TimeoutSeconds != 7 || *got.Webhooks[1].FailurePolicy != admissionregv1.Ignore {
		t.Errorf("the chart's settings were overwritten: %+v", got.Webhooks)
	}
}

func TestChartOwnedWebhookConfigIsNotRemovedOnExit(t *testing.T) {
	o := &Options{ServiceNamespace: "gpuaas", ServiceName: "ctrl", ConfigOwnedByChart: true, RemoveOnExit: true}
	if err := o.Validate(); err == nil {
		t.Fatal("Validate accepted remove-on-exit for a chart-owned configuration")
	}
}

// A replica is not ready before the configuration carries its CA.
func TestRegistrarReadyOnlyOnceConfigured(t *testing.T) {
	chart := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultConfigName},
		Webhooks:   []admissionregv1.ValidatingWebhook{{Name: "a.gpuaas.io"}},
	}
	c := newFakeClient(t)
	r := &Registrar{client: c, opts: chartOwnedOptions(t), caBundle: []byte("CA"),
		started: func(*http.Request) error { return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	time.Sleep(300 * time.Millisecond)
	if r.Configured(nil) == nil {
		t.Fatal("ready before the chart's configuration exists")
	}
	if err := c.Create(ctx, chart); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if r.Configured(nil) == nil {
		t.Fatal("ready before the chart's mutating configuration exists")
	}
	if err := c.Create(ctx, chartMutating()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for r.Configured(nil) != nil {
		if time.Now().After(deadline) {
			t.Fatal("never ready after the configuration appeared")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("registrar: %v", err)
	}
}

// Without the chart (demo, tests) the controller writes both
// configurations, and removes both on exit.
func TestRegistrarWritesAndRemovesBothConfigurations(t *testing.T) {
	o := &Options{URL: "https://127.0.0.1:9443", RemoveOnExit: true}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	c := newFakeClient(t)
	r := &Registrar{client: c, opts: o, caBundle: []byte("CA")}
	for range 2 { // the second time updates
		if err := r.apply(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	key := client.ObjectKey{Name: DefaultConfigName}
	var mutating admissionregv1.MutatingWebhookConfiguration
	if err := c.Get(context.Background(), key, &mutating); err != nil {
		t.Fatal(err)
	}
	if len(mutating.Webhooks) != 1 || string(mutating.Webhooks[0].ClientConfig.CABundle) != "CA" ||
		*mutating.Webhooks[0].ClientConfig.URL != o.URL+pathAlternatives {
		t.Fatalf("mutating configuration %+v", mutating.Webhooks)
	}
	r.remove(context.Background(), klog.Background())
	for _, obj := range []client.Object{&admissionregv1.ValidatingWebhookConfiguration{}, &admissionregv1.MutatingWebhookConfiguration{}} {
		if err := c.Get(context.Background(), key, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T still there after remove (get: %v)", obj, err)
		}
	}
}

func TestWebhookConfiguration(t *testing.T) {
	o := &Options{URL: "https://127.0.0.1:9443"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := validatingConfiguration(o, []string{"gpuaas-system"}, []byte("CA"))
	if cfg.Name != DefaultConfigName || len(cfg.Webhooks) != 4 {
		t.Fatalf("config = %s with %d webhooks", cfg.Name, len(cfg.Webhooks))
	}
	claims := cfg.Webhooks[0]
	if *claims.FailurePolicy != admissionregv1.Fail || *claims.ClientConfig.URL != "https://127.0.0.1:9443"+pathClaim ||
		string(claims.ClientConfig.CABundle) != "CA" || claims.Rules[0].Operations[0] != admissionregv1.Create {
		t.Fatalf("claim webhook = %+v", claims)
	}
	sel := claims.NamespaceSelector.MatchExpressions
	if len(sel) != 2 || !strings.Contains(strings.Join(sel[0].Values, ","), "kube-system") ||
		!strings.Contains(strings.Join(sel[0].Values, ","), "gpuaas-system") || sel[1].Key != "gpuaas.io/quota-exempt" {
		t.Fatalf("namespace selector = %+v", sel)
	}
	if cfg.Webhooks[2].NamespaceSelector != nil {
		t.Fatal("cluster-scoped webhook has a namespace selector")
	}
	// The catalog and quota validators fail open: a controller not ready yet
	// must not refuse the release's own GpuProfiles at helm install.
	for _, wh := range cfg.Webhooks[2:] {
		if *wh.FailurePolicy != admissionregv1.Ignore {
			t.Errorf("webhook %s fails %s, want Ignore", wh.Name, *wh.FailurePolicy)
		}
	}

	o = &Options{ServiceNamespace: "gpuaas", ServiceName: "ctrl"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	svc := validatingConfiguration(o, nil, nil).Webhooks[1].ClientConfig.Service
	if svc == nil || svc.Name != "ctrl" || *svc.Port != 443 || *svc.Path != pathTemplate {
		t.Fatalf("service = %+v", svc)
	}
	if dns, _ := o.dnsNames(); !strings.Contains(strings.Join(dns, ","), "ctrl.gpuaas.svc") {
		t.Fatalf("DNS names %v", dns)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, w := range []Options{
		{},
		{URL: "https://127.0.0.1:1", ServiceName: "x", ServiceNamespace: "y"},
		{ServiceName: "x"},
		{URL: "http://127.0.0.1:1"},
		{URL: "https://127.0.0.1:1", CertSecret: "nonamespace"},
	} {
		if err := w.Validate(); err == nil {
			t.Errorf("%+v accepted", w)
		}
	}
}
