package webhook

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Webhook paths served by the controller.
const (
	pathClaim    = "/validate-resourceclaim"
	pathTemplate = "/validate-resourceclaimtemplate"
	pathProfile  = "/validate-gpuprofile"
	pathQuota    = "/validate-tenantquota"
	// pathAlternatives is the mutating webhook of alternatives.go.
	pathAlternatives = "/trim-resourceclaim-alternatives"
)

// Names of the claim webhooks, which get the matchCondition of
// matchconditions.go at run time.
const (
	webhookClaims    = "resourceclaims.quota.gpuaas.io"
	webhookTemplates = "resourceclaimtemplates.config.gpuaas.io"
)

// webhookAlternatives names the mutating webhook of alternatives.go.
const webhookAlternatives = "resourceclaims.alternatives.gpuaas.io"

// defaultExemptNamespaces never pass through the quota webhook: system
// components must keep working while the controller is down.
var defaultExemptNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// exemptNamespaces is the exact list of namespaces whose claims skip quota:
// the defaults and the configured ones, nothing matched by a prefix (a
// tenant could name a namespace "kube-anything").
func exemptNamespaces(configured []string) []string {
	return append(append([]string(nil), defaultExemptNamespaces...), configured...)
}

// ValidatingConfiguration is the configuration the controller writes for
// o, with the configured exempt namespaces besides the defaults, without a
// CA bundle. The Helm chart renders the same webhooks itself (it
// owns them); a test of the chart compares the two. Neither has
// matchConditions: the controller adds the claim webhooks' at run time
// (matchconditions.go).
func ValidatingConfiguration(o *Options, exempt []string) *admissionregv1.ValidatingWebhookConfiguration {
	return validatingConfiguration(o, exempt, nil)
}

// validatingConfiguration renders the ValidatingWebhookConfiguration. Every
// webhook fails closed (an unreachable controller refuses claims rather than
// letting them past quota), so the namespaceSelector keeps system
// namespaces and those labelled gpuaas.io/quota-exempt out of reach (the
// chart's namespace-label policy keeps tenants from setting that label).
func validatingConfiguration(o *Options, exempt []string, caBundle []byte) *admissionregv1.ValidatingWebhookConfiguration {
	nsSelector := tenantNamespaces(exempt)
	mk := func(name, path string, rule admissionregv1.RuleWithOperations, namespaced bool) admissionregv1.ValidatingWebhook {
		wh := admissionregv1.ValidatingWebhook{
			Name:                    name,
			ClientConfig:            clientConfig(o, path, caBundle),
			Rules:                   []admissionregv1.RuleWithOperations{rule},
			FailurePolicy:           ptr.To(failurePolicy(namespaced)),
			MatchPolicy:             ptr.To(admissionregv1.Equivalent),
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNoneOnDryRun),
			TimeoutSeconds:          ptr.To(o.TimeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
		}
		if namespaced {
			wh.NamespaceSelector = nsSelector
		}
		return wh
	}
	return &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: configMeta(o),
		Webhooks: []admissionregv1.ValidatingWebhook{
			mk(webhookClaims, pathClaim,
				rule("resource.k8s.io", "resourceclaims", admissionregv1.Create), true),
			mk(webhookTemplates, pathTemplate,
				rule("resource.k8s.io", "resourceclaimtemplates", admissionregv1.Create, admissionregv1.Update), true),
			mk("gpuprofiles.gpuaas.io", pathProfile,
				rule(gpuaas.GroupName, "gpuprofiles", admissionregv1.Create, admissionregv1.Update), false),
			mk("tenantquotas.gpuaas.io", pathQuota,
				rule(gpuaas.GroupName, "tenantquotas", admissionregv1.Create, admissionregv1.Update), false),
		},
	}
}

// MutatingConfiguration is the mutating configuration the controller
// writes for o, without a CA bundle; the chart renders the same.
func MutatingConfiguration(o *Options, exempt []string) *admissionregv1.MutatingWebhookConfiguration {
	return mutatingConfiguration(o, exempt, nil)
}

// mutatingConfiguration renders the alternatives webhook
// (alternatives.go). It fails open and sees only new claims with
// alternatives to drop (its matchCondition), in the namespaces the quota
// webhook sees. It has the validating configuration's name: the two are
// different kinds.
func mutatingConfiguration(o *Options, exempt []string, caBundle []byte) *admissionregv1.MutatingWebhookConfiguration {
	return &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: configMeta(o),
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name:                    webhookAlternatives,
			ClientConfig:            clientConfig(o, pathAlternatives, caBundle),
			Rules:                   []admissionregv1.RuleWithOperations{rule("resource.k8s.io", "resourceclaims", admissionregv1.Create)},
			FailurePolicy:           ptr.To(admissionregv1.Ignore),
			MatchPolicy:             ptr.To(admissionregv1.Equivalent),
			NamespaceSelector:       tenantNamespaces(exempt),
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(o.TimeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregv1.NeverReinvocationPolicy),
			MatchConditions: []admissionregv1.MatchCondition{
				{Name: alternativesConditionName, Expression: alternativesCondition},
			},
		}},
	}
}

func configMeta(o *Options) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:   o.ConfigName,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "gpuaas-dra-controller"},
	}
}

// tenantNamespaces selects the namespaces whose claims are charged: not
// the exempt ones, by name or label.
func tenantNamespaces(exempt []string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: exemptNamespaces(exempt)},
		{Key: gpuaas.QuotaExemptLabel, Operator: metav1.LabelSelectorOpDoesNotExist},
	}}
}

// failurePolicy fails closed for claims (an unreachable controller must not
// let claims past quota) and open for our own catalog and quota objects:
// the controller validates those again when it reconciles them and reports
// the result in their status, and failing closed there made `helm install`
// fail whenever the controller registered its webhook before its pod was
// ready (the release's own GpuProfiles were refused: "no endpoints
// available"), and left a reinstall refused after an uninstall.
func failurePolicy(claimWebhook bool) admissionregv1.FailurePolicyType {
	if claimWebhook {
		return admissionregv1.Fail
	}
	return admissionregv1.Ignore
}

// rule matches v1 only: with matchPolicy Equivalent the apiserver converts
// requests made through other versions (v1beta1, v1beta2) to v1 for us.
func rule(group, resource string, ops ...admissionregv1.OperationType) admissionregv1.RuleWithOperations {
	version := "v1"
	if group == gpuaas.GroupName {
		version = gpuaas.GroupVersion.Version
	}
	return admissionregv1.RuleWithOperations{
		Operations: ops,
		Rule: admissionregv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{version}, Resources: []string{resource},
			Scope: ptr.To(admissionregv1.AllScopes),
		},
	}
}

func clientConfig(w *Options, path string, caBundle []byte) admissionregv1.WebhookClientConfig {
	if w.URL != "" {
		return admissionregv1.WebhookClientConfig{URL: ptr.To(w.URL + path), CABundle: caBundle}
	}
	return admissionregv1.WebhookClientConfig{
		Service: &admissionregv1.ServiceReference{
			Namespace: w.ServiceNamespace, Name: w.ServiceName, Path: ptr.To(path), Port: ptr.To(w.ServicePort),
		},
		CABundle: caBundle,
	}
}

// Registrar creates or updates the webhook configuration once this
// process serves the webhook, and (RemoveOnExit) deletes it on shutdown.
// It runs on every replica: they all serve, and with a shared CA they
// write the same configuration.
type Registrar struct {
	client   client.Client
	opts     *Options
	exempt   []string // configured, besides the defaults
	caBundle []byte
	started  func(*http.Request) error
	// configured is set once the configuration carries our CA: before
	// that the apiserver cannot verify our certificate and claims fail.
	configured atomic.Bool
}

// NewRegistrar writes the configurations for o (exempt: the configured
// exempt namespaces) with caBundle once started says the server serves.
func NewRegistrar(c client.Client, o *Options, exempt []string, caBundle []byte, started func(*http.Request) error) *Registrar {
	return &Registrar{client: c, opts: o, exempt: exempt, caBundle: caBundle, started: started}
}

// Configured is a readiness check: a replica is ready only once the
// webhook configuration trusts its certificate. Without it, helm install
// reported the controller ready while the chart's configuration had no CA
// yet, and the first claims failed "certificate signed by unknown
// authority".
func (r *Registrar) Configured(*http.Request) error {
	if !r.configured.Load() {
		return fmt.Errorf("webhook configuration %s not written yet", r.opts.ConfigName)
	}
	return nil
}

func (r *Registrar) NeedLeaderElection() bool { return false }

func (r *Registrar) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("webhook-config")
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return r.started(nil) == nil, nil
	})
	if err != nil {
		return nil // shutting down before the server came up
	}
	err = wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 8, Cap: 10 * time.Second},
		func(ctx context.Context) (bool, error) {
			if err := r.apply(ctx); err != nil {
				logger.Error(err, "Writing webhook configuration failed, retrying")
				return false, nil
			}
			return true, nil
		})
	if err != nil {
		return fmt.Errorf("writing webhook configuration %s: %w", r.opts.ConfigName, err)
	}
	r.configured.Store(true)
	logger.Info("Webhook configuration ready", "name", r.opts.ConfigName)
	<-ctx.Done()
	if r.opts.RemoveOnExit {
		// The manager's context is done; removal gets a little time of
		// its own.
		r.remove(context.WithoutCancel(ctx), logger)
	}
	return nil
}

func (r *Registrar) apply(ctx context.Context) error {
	if r.opts.ConfigOwnedByChart {
		return r.injectCABundle(ctx)
	}
	if err := r.applyValidating(ctx); err != nil {
		return err
	}
	return r.applyMutating(ctx)
}

// applyMutating and applyValidating create or update the configurations,
// keeping what others own in them: a CA bundle injected by someone else
// (cert-manager) when we have none, and the leader's matchConditions.
func (r *Registrar) applyMutating(ctx context.Context) error {
	want := mutatingConfiguration(r.opts, r.exempt, r.caBundle)
	have := &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: want.Name}}
	_, err := controllerutil.CreateOrUpdate(ctx, r.client, have, func() error {
		if r.caBundle == nil && len(have.Webhooks) == len(want.Webhooks) {
			for i := range want.Webhooks {
				want.Webhooks[i].ClientConfig.CABundle = have.Webhooks[i].ClientConfig.CABundle
			}
		}
		have.Webhooks, have.Labels = want.Webhooks, want.Labels
		return nil
	})
	return err
}

func (r *Registrar) applyValidating(ctx context.Context) error {
	want := validatingConfiguration(r.opts, r.exempt, r.caBundle)
	have := &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: want.Name}}
	_, err := controllerutil.CreateOrUpdate(ctx, r.client, have, func() error {
		if r.caBundle == nil {
			keepCABundles(want, have)
		}
		keepMatchConditions(want, have)
		have.Webhooks, have.Labels = want.Webhooks, want.Labels
		return nil
	})
	return err
}

// injectCABundle writes the CA into every webhook of the configurations
// the chart installed. It waits (the caller retries) while one does not
// exist: creating it here would leave it behind after helm uninstall.
func (r *Registrar) injectCABundle(ctx context.Context) error {
	if r.caBundle == nil {
		return nil // injected by someone else (cert-manager)
	}
	key := client.ObjectKey{Name: r.opts.ConfigName}
	var validating admissionregv1.ValidatingWebhookConfiguration
	if err := r.client.Get(ctx, key, &validating); err != nil {
		return fmt.Errorf("getting the chart's validating webhook configuration: %w", err)
	}
	if r.setCABundle(len(validating.Webhooks), func(i int) *[]byte { return &validating.Webhooks[i].ClientConfig.CABundle }) {
		if err := r.client.Update(ctx, &validating); err != nil {
			return err
		}
	}
	var mutating admissionregv1.MutatingWebhookConfiguration
	if err := r.client.Get(ctx, key, &mutating); err != nil {
		return fmt.Errorf("getting the chart's mutating webhook configuration: %w", err)
	}
	if r.setCABundle(len(mutating.Webhooks), func(i int) *[]byte { return &mutating.Webhooks[i].ClientConfig.CABundle }) {
		return r.client.Update(ctx, &mutating)
	}
	return nil
}

// setCABundle puts our CA into n webhooks' bundles and tells whether one
// changed.
func (r *Registrar) setCABundle(n int, bundle func(int) *[]byte) bool {
	changed := false
	for i := range n {
		if b := bundle(i); !bytes.Equal(*b, r.caBundle) {
			*b, changed = r.caBundle, true
		}
	}
	return changed
}

func keepCABundles(want, have *admissionregv1.ValidatingWebhookConfiguration) {
	for i := range want.Webhooks {
		for _, h := range have.Webhooks {
			if h.Name == want.Webhooks[i].Name {
				want.Webhooks[i].ClientConfig.CABundle = h.ClientConfig.CABundle
			}
		}
	}
}

func (r *Registrar) remove(ctx context.Context, logger klog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	meta := metav1.ObjectMeta{Name: r.opts.ConfigName}
	for kind, obj := range map[string]client.Object{
		"validating": &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: meta},
		"mutating":   &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: meta},
	} {
		if err := r.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			logger.Error(err, "Removing webhook configuration failed", "kind", kind)
			return
		}
	}
	logger.Info("Webhook configuration removed", "name", r.opts.ConfigName)
}
