package controller

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billingreaders"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/catalog"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/gpunode"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/hardwareprofiles"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/idle"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/enqueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/kueuemirror"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/shapes"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/slicecache"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhook"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhookcert"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Scheme knows the built-in types and ours.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding built-in types: %w", err)
	}
	if err := gpuaas.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding gpuaas.io types: %w", err)
	}
	return s, nil
}

// Run runs the controller until ctx ends: certificates, the webhook server
// and its configuration, the reconcilers (leader only), metrics and health
// endpoints.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	registerMetrics()
	catalog.RegisterMetrics()
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	cfg = withRateLimits(cfg, &opts)
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	if opts.ApplyCRDs {
		err := untilAPIAnswers(ctx, "applying the gpuaas.io CRDs", func(ctx context.Context) error { return ApplyCRDs(ctx, direct) })
		if err != nil {
			return err
		}
	}
	certs := opts.Webhook.CertConfig()
	var caBundle []byte
	err = untilAPIAnswers(ctx, "the webhook certificate", func(ctx context.Context) error {
		ca, err := webhookcert.Ensure(ctx, direct, certs, time.Now())
		caBundle = ca
		return err
	})
	if err != nil {
		return fmt.Errorf("preparing webhook certificate: %w", err)
	}
	served, err := webhookcert.NewServed(certs)
	if err != nil {
		return err
	}
	mgr, err := newManager(ctx, cfg, scheme, &opts, served)
	if err != nil {
		return err
	}
	cachedSlicesCollector.use(mgr.GetCache())
	if err := setup(ctx, mgr, direct, &opts, caBundle); err != nil {
		return err
	}
	if err := webhookcert.SetupRotation(ctx, mgr, certs, served); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Starting dra-controller", "webhookPort", opts.Webhook.Port, "leaderElection", opts.LeaderElection)
	if err := mgr.Start(ctx); err != nil {
		return managerError(&opts, err)
	}
	return nil
}

// managerError wraps what ended the manager. With leader election that is
// most often a Lease the leader could not renew in time ("leader election
// lost", controller-runtime's words), which alone does not say that the
// API server was out of reach; the restarted process waits for it.
func managerError(opts *Options, err error) error {
	if opts.LeaderElection {
		return fmt.Errorf("running manager (it ends when the leader cannot renew its Lease %s/%s in time, as when the API server cannot be reached): %w",
			opts.LeaderElectionNamespace, opts.LeaderElectionID, err)
	}
	return fmt.Errorf("running manager: %w", err)
}

// Rate limits of the controller's API clients. client-go's defaults (5
// requests/s, burst 10) held quota-ledger writes, and so admissions, to
// about 20 claims/s at 1,000 tenants (BENCHMARKS.md).
const (
	DefaultKubeAPIQPS   = 100
	DefaultKubeAPIBurst = 200
)

// withRateLimits is cfg with the options' request rate, unless cfg sets
// its own rate limiter.
func withRateLimits(cfg *rest.Config, opts *Options) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	if cfg.RateLimiter == nil {
		cfg.QPS = cmp.Or(opts.KubeAPIQPS, DefaultKubeAPIQPS)
		cfg.Burst = cmp.Or(opts.KubeAPIBurst, DefaultKubeAPIBurst)
	}
	return cfg
}

func newManager(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, opts *Options, served *webhookcert.Served) (manager.Manager, error) {
	tlsOpts := []func(*tls.Config){webhookHTTP1Only}
	cacheOpts := cacheOptions(served)
	if served != nil {
		tlsOpts = append(tlsOpts, served.TLSOption)
	}
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Cache:                         cacheOpts,
		Scheme:                        scheme,
		Logger:                        klog.FromContext(ctx),
		Metrics:                       metricsOptions(opts),
		HealthProbeBindAddress:        opts.HealthAddr,
		PprofBindAddress:              opts.PprofAddr,
		LeaderElection:                opts.LeaderElection,
		LeaderElectionNamespace:       opts.LeaderElectionNamespace,
		LeaderElectionID:              opts.LeaderElectionID,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host: opts.Webhook.Host, Port: opts.Webhook.Port, CertDir: opts.Webhook.CertDir,
			TLSOpts: tlsOpts,
		}),
		// A controller restarted inside one process (tests) registers
		// its controllers under the same names again.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	return mgr, nil
}

// cacheOptions is what the manager's cache, which every replica runs for
// the webhook, holds of each kind (docs/architecture.md, "What the
// controller caches"): no kind with its managedFields, which nothing reads
// (an update of an object read from the cache sends none, and the server
// keeps its own); ResourceSlices of our driver only, as only ours are
// priced (quota.NewInventory), given a posture (pkg/posture) or counted in
// the GpuNodes; the GPU+NIC shape's count reads other drivers' from a
// cache of its own, on the leader (shapes.ForeignSliceCache).
func cacheOptions(served *webhookcert.Served) cache.Options {
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			// Only the shapes' templates, not every tenant's.
			&resourceapi.ResourceClaimTemplate{}: shapes.TemplateCache(),
			// What repeats across devices and nodes held once (slicecache).
			&resourceapi.ResourceSlice{}: {Field: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, quota.DriverName),
				Transform: slicecache.Transform},
			// Only the billing readers' roles and bindings.
			&rbacv1.ClusterRole{}:        billingreaders.Cache(),
			&rbacv1.ClusterRoleBinding{}: billingreaders.Cache(),
		},
	}
	if served != nil {
		opts.ByObject[&corev1.Secret{}] = served.SecretCache()
	}
	return opts
}

// setup wires everything into the manager; direct is an uncached client
// for the few objects not worth an informer (the webhook configuration).
func setup(ctx context.Context, mgr manager.Manager, direct client.Client, opts *Options, caBundle []byte) error {
	err := waitForKinds(ctx, mgr.GetRESTMapper(),
		gpuaas.GroupVersion.WithKind(gpuaas.GpuProfileKind), gpuaas.GroupVersion.WithKind(gpuaas.TenantQuotaKind))
	if err != nil {
		return fmt.Errorf("waiting for the gpuaas.io CRDs: %w", err)
	}
	err = mgr.GetFieldIndexer().IndexField(ctx, &resourceapi.ResourceClaim{}, catalog.IndexClaimClasses, catalog.ClaimClasses)
	if err != nil {
		return fmt.Errorf("indexing ResourceClaims: %w", err)
	}
	acct := admission.NewAccountant(mgr.GetCache(), mgr.GetAPIReader(), admission.NewLedger(direct, opts.LedgerNamespace))
	acct.DenyUnassigned = opts.DenyUnassigned
	acct.ReclaimAfter, acct.ReclaimEvents = opts.ReclaimUnallocatedAfter, mgr.GetEventRecorder("gpuaas-dra-controller")
	nudge := admission.NewNudger(mgr.GetClient(), opts.NudgeWaitingPods)
	if err := admission.Watch(ctx, mgr.GetCache(), acct, nudge); err != nil {
		return err
	}
	conditions := webhook.NewMatchConditionSyncer(direct, acct.ForeignClasses, opts.Webhook.ConfigName, opts.Resync)
	if err := webhook.WatchForeignClasses(ctx, mgr.GetCache(), acct.InvalidateCatalog, conditions); err != nil {
		return err
	}
	var gate *admission.KueueGate
	if opts.Kueue {
		gate = admission.NewKueueGate(mgr.GetAPIReader(), direct, opts.LedgerNamespace, opts.KueueClaimCreators, acct)
	}
	refuser, shapeSlices, err := shapes.Setup(ctx, mgr, cmp.Or(opts.Resync, defaultResync))
	if err != nil {
		return err
	}
	cachedSlicesCollector.useShapes(shapeSlices)
	if refuser != nil { // the GpuShape CRD is served: limits.shapes can be charged
		if err := admission.WatchShapes(ctx, mgr.GetCache(), acct); err != nil {
			return err
		}
	}
	if err := webhook.Register(mgr, acct, nudge, gate, refuser, opts.ExemptNamespaces); err != nil {
		return err
	}
	if err := setupReconcilers(mgr, acct, conditions, opts); err != nil {
		return err
	}
	_, err = billing.Setup(mgr, acct, billing.Options{Currency: opts.BillingCurrency, Resync: cmp.Or(opts.Resync, defaultResync), Shapes: refuser != nil,
		RetentionMonths: opts.BillingRetentionMonths})
	if err != nil {
		return err
	}
	if err := billingreaders.Setup(mgr); err != nil {
		return err
	}
	if err := gpunode.Setup(ctx, mgr); err != nil {
		return err
	}
	if opts.IdlePolicy {
		err := idle.Setup(mgr, idle.Options{LeaseNamespace: opts.LedgerNamespace, Kueue: opts.Kueue,
			Events: mgr.GetEventRecorder("gpuaas-dra-controller")})
		if err != nil {
			return err
		}
	}
	if opts.QuotaBackstop {
		r := &backstopReconciler{client: mgr.GetClient(), skipKueue: opts.Kueue,
			reached: acct.ProfilesReached, invalidate: acct.InvalidateCatalog}
		if err := r.setup(mgr); err != nil {
			return fmt.Errorf("setting up the quota backstop: %w", err)
		}
	}
	if opts.Kueue {
		if err := kueuemirror.Setup(mgr, direct, opts.LedgerNamespace, opts.Resync, refuser != nil, acct); err != nil {
			return err
		}
	}
	if opts.HardwareProfileNamespace != "" || opts.HardwareProfilesPerTenant {
		cfg := hardwareprofiles.Config{Namespace: opts.HardwareProfileNamespace, PerTenant: opts.HardwareProfilesPerTenant, Resync: opts.Resync}
		if err := hardwareprofiles.Setup(mgr, direct, cfg); err != nil {
			return err
		}
	}
	registrar := webhook.NewRegistrar(direct, &opts.Webhook, opts.ExemptNamespaces, caBundle, mgr.GetWebhookServer().StartedChecker())
	sweeper := admission.NewBookSweeper(direct, opts.LedgerNamespace)
	runnables := []manager.Runnable{nudge, registrar, conditions, sweeper}
	if gate != nil {
		runnables = append(runnables, gate.Sweeper())
	}
	for _, r := range runnables {
		if err := mgr.Add(r); err != nil {
			return fmt.Errorf("adding runnable: %w", err)
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook-config", registrar.Configured); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("caches", cachesSynced(mgr.GetCache())); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	return nil
}

// cachesSynced keeps a replica out of the webhook Service until its
// informers have listed everything: before that, a review waits for the
// sync and runs into the apiserver's webhook timeout (a refused claim
// during every rollout).
func cachesSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), 50*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches not synced yet")
		}
		return nil
	}
}

func setupReconcilers(mgr manager.Manager, acct *admission.Accountant, conditions *webhook.MatchConditionSyncer, opts *Options) error {
	c := mgr.GetClient()
	err := ctrl.NewControllerManagedBy(mgr).Named("gpuprofile").
		For(&gpuaas.GpuProfile{}).
		Watches(&resourceapi.DeviceClass{}, handler.EnqueueRequestsFromMapFunc(sameName)).
		Watches(&resourceapi.ResourceSlice{}, enqueue.Delayed(statusDelay, allOf(profileNames(c)))).
		Watches(&resourceapi.ResourceClaim{}, enqueue.Delayed(statusDelay, claimProfiles)).
		Complete(catalog.NewReconciler(c, acct, opts.Resync, time.Now(), conditions.Exclude))
	if err != nil {
		return fmt.Errorf("setting up GpuProfile controller: %w", err)
	}
	everyQuota := handler.EnqueueRequestsFromMapFunc(allOf(quotaNames(c)))
	err = ctrl.NewControllerManagedBy(mgr).Named("tenantquota").
		// Its own status writes do not requeue a quota either: the
		// resync and the claim events bring its usage.
		For(&gpuaas.TenantQuota{}, builder.WithPredicates(quotaSpecChanged)).
		// One quota's namespaces decide the others' conflicts: its spec,
		// not its status, which every reconcile writes (requeueing all
		// quotas on each status write cost N^2 with N tenants).
		Watches(&gpuaas.TenantQuota{}, everyQuota, builder.WithPredicates(quotaSpecChanged)).
		Watches(&corev1.Namespace{}, everyQuota, builder.WithPredicates(namespaceTenancyChanged)).
		// Slices and classes bear on usage through prices only.
		Watches(&resourceapi.ResourceSlice{}, everyQuota, builder.WithPredicates(admission.PricesMoved(&resourceapi.ResourceSlice{}))).
		Watches(&resourceapi.DeviceClass{}, everyQuota, builder.WithPredicates(admission.PricesMoved(&resourceapi.DeviceClass{}))).
		Watches(&resourceapi.ResourceClaim{}, handler.EnqueueRequestsFromMapFunc(claimQuota(acct))).
		Complete(&quotaReconciler{client: c, acct: acct, resync: opts.Resync})
	if err != nil {
		return fmt.Errorf("setting up TenantQuota controller: %w", err)
	}
	return nil
}

// quotaSpecChanged passes a TenantQuota's creation, deletion and spec
// changes (its generation), not its status writes.
var quotaSpecChanged = predicate.GenerationChangedPredicate{}

// namespaceTenancyChanged passes a namespace's creation, deletion and label
// changes: labels are what TenantQuotas select namespaces by.
var namespaceTenancyChanged = predicate.LabelChangedPredicate{}

// webhookHTTP1Only turns HTTP/2 off on the webhook server. The
// kube-apiserver keeps one HTTP/2 connection per webhook Service and sends
// every review over it, so with HTTP/2 one replica takes all the traffic
// until the connection drops; over HTTP/1.1 it dials a connection per
// concurrent request, each to an endpoint it picks at random. It also
// takes HTTP/2's rapid-reset attack (CVE-2023-44487) off the table.
func webhookHTTP1Only(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }

// metricsOptions serves /metrics over HTTPS behind the API server's
// authentication and authorization when opts.MetricsSecure (a self-signed
// certificate: scrapers authenticate the controller by its Service), HTTP/1.1
// only as the webhook (HTTP/2 rapid reset, CVE-2023-44487).
func metricsOptions(opts *Options) metricsserver.Options {
	o := metricsserver.Options{BindAddress: opts.MetricsAddr}
	if opts.MetricsSecure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
		o.TLSOpts = []func(*tls.Config){webhookHTTP1Only}
	}
	return o
}

// ReleaseFinalizers is the chart's pre-delete hook (dra-controller
// --release-finalizers): see catalog.ReleaseFinalizers.
func ReleaseFinalizers(ctx context.Context, cfg *rest.Config) error {
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	return catalog.ReleaseFinalizers(ctx, c)
}
