package controller

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhookcert"
)

// Defaults.
const (
	DefaultWebhookConfigName = "gpuaas-dra-controller"
	DefaultLeaderElectionID  = "gpuaas-dra-controller"
	DefaultWebhookPort       = 9443
	defaultResync            = 30 * time.Second
	// DefaultReclaimUnallocatedAfter is long enough for a pod's claim to
	// be scheduled on a busy cluster, short enough that a lender is not
	// locked out for long by claims no pod uses.
	DefaultReclaimUnallocatedAfter = 10 * time.Minute
)

// DefaultKueueClaimCreators are the identities the kube-controller-manager
// makes claims as: its resource-claim controller's ServiceAccount with
// --use-service-account-credentials (kubeadm and most distributions), or
// its own user without.
var DefaultKueueClaimCreators = []string{
	"system:serviceaccount:kube-system:resource-claim-controller",
	"system:kube-controller-manager",
}

// Options configure Run; cmd/dra-controller fills them from flags.
type Options struct {
	// MetricsAddr and HealthAddr are listen addresses; "0" disables.
	MetricsAddr, HealthAddr string
	// KubeAPIQPS and KubeAPIBurst bound the controller's requests to the
	// API server, per resource type (each client-go REST client has its
	// own limiter); zero means DefaultKubeAPIQPS and DefaultKubeAPIBurst.
	// The quota ledger's book writes are on the admission path, so this
	// limit is an admission throughput limit.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// PprofAddr serves Go's /debug/pprof for profiling a running
	// controller; empty (the default) serves nothing.
	PprofAddr string
	// MetricsSecure serves /metrics over HTTPS, to callers the API server
	// authenticates (TokenReview) and authorizes (SubjectAccessReview, get
	// on the non-resource URL /metrics): the metrics name every tenant and
	// its usage, which plain HTTP gave anyone on the pod network.
	MetricsSecure bool

	LeaderElection          bool
	LeaderElectionNamespace string
	LeaderElectionID        string

	Webhook WebhookOptions

	// LedgerNamespace holds the quota ledger: the reservations of claims
	// admitted a moment ago, shared by all replicas; default "default".
	LedgerNamespace string
	// ApplyCRDs brings the gpuaas.io CRDs to this binary's version at
	// start (helm never upgrades a chart's crds/).
	ApplyCRDs bool

	// ExemptNamespaces are left out of the quota webhook by the webhook
	// configuration's namespaceSelector (so an outage of this controller
	// never blocks them); namespaces starting with "kube-" and those
	// labelled gpuaas.io/quota-exempt are exempt as well.
	ExemptNamespaces []string

	// DenyUnassigned refuses claims for our devices in namespaces that no
	// TenantQuota covers, instead of letting them through uncharged.
	DenyUnassigned bool

	// NudgeWaitingPods: when quota frees up, touch the pods whose template
	// claims were denied so the kube-controller-manager retries them at
	// once rather than after its back-off (up to ~16 minutes).
	NudgeWaitingPods bool

	// Kueue admits the claims the kube-controller-manager makes for the
	// pods of workloads Kueue has admitted even over their tenant's quota,
	// up to what Kueue charged each workload (they are still charged), so
	// that Kueue and the TenantQuota never strand an admitted gang between
	// them (docs/kueue.md). Needs read access to Kueue's Workloads, and to
	// the owners between a pod and its workload (Jobs, StatefulSets...).
	Kueue bool
	// KueueClaimCreators are the users whose ResourceClaims can be
	// overruled for Kueue: the kube-controller-manager's, which makes a
	// pod's claims from its templates. Anything else (a tenant's own
	// claim naming a pod of an admitted Job) is judged by the quota alone.
	// Empty means DefaultKueueClaimCreators.
	KueueClaimCreators []string

	// QuotaBackstop keeps a ResourceQuota in each namespace of a
	// TenantQuota with device limits, so the API server enforces those
	// limits too, whatever the webhook does (backstop.go). With Kueue,
	// tenants Kueue admits for (spec.kueue) get none.
	QuotaBackstop bool

	// ReclaimUnallocatedAfter: a cohort lender refused within its own
	// limit because its quota is lent out gets it back from the borrowers'
	// claims that have stayed unallocated for longer than this: they are
	// deleted (reclaim.go). Zero: lenders wait until borrowers give back.
	ReclaimUnallocatedAfter time.Duration

	// Resync is how often quota status (and the gpu-unit-seconds billing
	// counter) is refreshed without any change; default 30s.
	Resync time.Duration
}

// WebhookOptions say where the webhook listens and how the apiserver
// reaches it.
type WebhookOptions struct {
	Host    string
	Port    int
	CertDir string

	// Exactly one of Service (in-cluster) or URL (tests, demo: the
	// apiserver on the same host) is the webhook's address.
	ServiceNamespace, ServiceName string
	ServicePort                   int32
	URL                           string

	// CertSecret ("namespace/name") shares the self-signed CA and serving
	// certificate between replicas; without it each process makes its own,
	// which suits one replica.
	CertSecret string

	// ExternalCerts: the certificate files in CertDir come from elsewhere
	// (cert-manager); the controller neither writes them nor the caBundle,
	// unless CAFile names the CA to inject.
	ExternalCerts bool
	CAFile        string

	// ConfigName names the ValidatingWebhookConfiguration and the
	// MutatingWebhookConfiguration the controller creates and keeps
	// current (or, ConfigOwnedByChart, injects its CA into).
	ConfigName string
	// TimeoutSeconds of each webhook call (1-30); default 5.
	TimeoutSeconds int32
	// RemoveOnExit deletes the webhook configuration on shutdown (tests,
	// demo): a configuration pointing at a stopped controller with
	// failurePolicy Fail blocks claims.
	RemoveOnExit bool
	// ConfigOwnedByChart: the Helm chart installs (and uninstall removes)
	// the webhook configuration; the controller only injects its CA
	// bundle and never creates or deletes it, so nothing it wrote outlives
	// the release.
	ConfigOwnedByChart bool
}

// Validate checks and defaults the options.
func (o *Options) Validate() error {
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = DefaultLeaderElectionID
	}
	if o.LedgerNamespace == "" {
		o.LedgerNamespace = "default"
	}
	if o.Resync <= 0 {
		o.Resync = defaultResync
	}
	if len(o.KueueClaimCreators) == 0 {
		o.KueueClaimCreators = slices.Clone(DefaultKueueClaimCreators)
	}
	if o.KubeAPIQPS < 0 || o.KubeAPIBurst < 0 {
		return fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d must not be negative", o.KubeAPIQPS, o.KubeAPIBurst)
	}
	return o.Webhook.validate()
}

func (w *WebhookOptions) validate() error {
	if w.ConfigName == "" {
		w.ConfigName = DefaultWebhookConfigName
	}
	if w.Port == 0 {
		w.Port = DefaultWebhookPort
	}
	if w.ServicePort == 0 {
		w.ServicePort = 443
	}
	if w.TimeoutSeconds == 0 {
		w.TimeoutSeconds = 5
	}
	hasService, hasURL := w.ServiceName != "", w.URL != ""
	switch {
	case hasService == hasURL:
		return errors.New("webhook: set exactly one of the service (namespace/name) and the URL")
	case hasService && w.ServiceNamespace == "":
		return errors.New("webhook: the service needs a namespace")
	case hasURL:
		u, err := url.Parse(w.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("webhook: URL %q must be https://host:port", w.URL)
		}
	}
	if w.CertSecret != "" && !strings.Contains(w.CertSecret, "/") {
		return fmt.Errorf("webhook: cert secret %q must be namespace/name", w.CertSecret)
	}
	if w.ConfigOwnedByChart && w.RemoveOnExit {
		return errors.New("webhook: a configuration owned by the chart is removed by helm uninstall, not on exit")
	}
	if w.TimeoutSeconds < 1 || w.TimeoutSeconds > 30 {
		return fmt.Errorf("webhook: timeout %ds out of 1-30", w.TimeoutSeconds)
	}
	return nil
}

// dnsNames are the names the serving certificate must carry.
func (w *WebhookOptions) dnsNames() (dns []string, ips []string) {
	if w.URL != "" {
		u, _ := url.Parse(w.URL)
		host := u.Hostname()
		if isIP(host) {
			return nil, []string{host}
		}
		return []string{host}, nil
	}
	svc := w.ServiceName + "." + w.ServiceNamespace
	return []string{w.ServiceName, svc, svc + ".svc", svc + ".svc.cluster.local"}, nil
}

func isIP(host string) bool { return net.ParseIP(host) != nil }

// certConfig is what the webhook's certificates need of the options.
func (w *WebhookOptions) certConfig() *webhookcert.Config {
	dns, ips := w.dnsNames()
	return &webhookcert.Config{
		CertDir: w.CertDir, CertSecret: w.CertSecret, ExternalCerts: w.ExternalCerts, CAFile: w.CAFile,
		ConfigName: w.ConfigName, DNSNames: dns, IPs: ips,
	}
}
