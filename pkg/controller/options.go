package controller

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhook"
)

// Defaults.
const (
	DefaultWebhookConfigName = webhook.DefaultConfigName
	DefaultLeaderElectionID  = "gpuaas-dra-controller"
	DefaultWebhookPort       = webhook.DefaultPort
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

	Webhook webhook.Options

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

	// HardwareProfileNamespace, when set, is where each GpuProfile is
	// published as an OpenShift AI HardwareProfile, once that CRD is served
	// (pkg/controller/hardwareprofiles); empty publishes none.
	HardwareProfileNamespace string

	// HardwareProfilesPerTenant publishes each GpuProfile as a
	// HardwareProfile in every tenant's namespaces too, scheduled as the
	// tenant is (Queue with its LocalQueue where it is Kueue-managed, Node
	// otherwise). GpuShapes are published in their tenants' namespaces
	// holding their templates whenever either this or
	// HardwareProfileNamespace is set.
	HardwareProfilesPerTenant bool

	// QuotaBackstop keeps a ResourceQuota in each namespace of a
	// TenantQuota with device limits, so the API server enforces those
	// limits too, whatever the webhook does (backstop.go). With Kueue,
	// tenants Kueue admits for (spec.kueue) get none.
	QuotaBackstop bool

	// ReclaimUnallocatedAfter: a cohort lender refused within its own
	// limit because its quota is lent out gets it back from the borrowers'
	// claims that have stayed unallocated for longer than this: they are
	// deleted (admission/reclaim.go). Zero: lenders wait until borrowers give back.
	ReclaimUnallocatedAfter time.Duration

	// IdlePolicy enforces the idle policies of TenantQuotas and
	// GpuProfiles (spec.idlePolicy) on allocated claims the plugins
	// report idle (pkg/controller/idle, docs/idle-policy.md). The plugins'
	// use Leases are read in LedgerNamespace, the chart's namespace.
	IdlePolicy bool

	// BillingCurrency is the one currency of every price on GpuProfiles
	// and GpuShapes and of the cost metrics (docs/platform.md, "Billing").
	BillingCurrency string

	// BillingRetentionMonths: the leader deletes a tenant's TenantUsage
	// once its month ended more than this many months before the current
	// one (never the current or the previous month's); 0 keeps them all.
	BillingRetentionMonths int

	// Resync is how often quota status is refreshed, and the open billing
	// records' lastSeen written, without any change; default 30s.
	Resync time.Duration
}

// WebhookOptions say where the webhook listens and how the apiserver
// reaches it (cmd/dra-controller fills them from flags).
type WebhookOptions = webhook.Options

// Validate checks and defaults the options.
func (o *Options) Validate() error {
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = DefaultLeaderElectionID
	}
	if o.LedgerNamespace == "" {
		o.LedgerNamespace = "default"
	}
	if o.BillingCurrency == "" {
		o.BillingCurrency = "USD"
	}
	if o.Resync <= 0 {
		o.Resync = defaultResync
	}
	if len(o.KueueClaimCreators) == 0 {
		o.KueueClaimCreators = slices.Clone(DefaultKueueClaimCreators)
	}
	if o.BillingRetentionMonths < 0 {
		return fmt.Errorf("--billing-retention-months %d must not be negative (0 keeps every month)", o.BillingRetentionMonths)
	}
	if o.KubeAPIQPS < 0 || o.KubeAPIBurst < 0 {
		return fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d must not be negative", o.KubeAPIQPS, o.KubeAPIBurst)
	}
	if o.HardwareProfileNamespace != "" {
		if errs := validation.IsDNS1123Label(o.HardwareProfileNamespace); len(errs) > 0 {
			return fmt.Errorf("--hardware-profile-namespace %q: %s", o.HardwareProfileNamespace, strings.Join(errs, "; "))
		}
	}
	return o.Webhook.Validate()
}
