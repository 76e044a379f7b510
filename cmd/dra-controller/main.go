// Command dra-controller is the control plane of the gpu.gpuaas.io GPU
// service: it renders the GpuProfile catalog into DeviceClasses, charges
// ResourceClaims against TenantQuotas in a validating webhook, and reports
// usage in status and metrics. This file only parses flags and wires
// packages together; everything else is pkg/controller.
package main

import (
	"context"
	"fmt"
	"github.com/gpuaas/gpu-dra-driver/pkg/cli"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
)

type flags struct {
	kubeconfig        string
	webhookService    string
	releaseFinalizers bool
	opts              controller.Options
}

func main() {
	f := parseFlags()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	logger := klog.Background().WithName("dra-controller")
	ctrl.SetLogger(logger)
	ctx = klog.NewContext(ctx, logger)
	if err := run(ctx, f); err != nil {
		logger.Error(err, "Controller failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

func parseFlags() *flags {
	f := &flags{}
	o, w := &f.opts, &f.opts.Webhook
	fs := pflag.CommandLine
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "Kubeconfig file; empty means in-cluster configuration. [$KUBECONFIG]")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", cli.Env("METRICS_ADDR", ":8080"), "Address of the Prometheus /metrics endpoint; \"0\" disables it. [$METRICS_ADDR]")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", cli.Env("METRICS_SECURE", "true") == "true", "Serve /metrics over HTTPS to callers the API server authenticates and authorizes (get on the non-resource URL /metrics); false serves plain HTTP to anyone. [$METRICS_SECURE]")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", controller.DefaultKubeAPIQPS, "Requests per second to the API server, per resource type. Quota-ledger writes are on the admission path: this bounds admissions per second (group commit folds several into one write).")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", controller.DefaultKubeAPIBurst, "Burst of requests to the API server, per resource type.")
	fs.StringVar(&o.PprofAddr, "pprof-addr", os.Getenv("PPROF_ADDR"), "Address of Go's /debug/pprof endpoints, for profiling; empty disables them (keep it on localhost: they are not authenticated). [$PPROF_ADDR]")
	fs.StringVar(&o.HealthAddr, "health-addr", cli.Env("HEALTH_ADDR", ":8081"), "Address of /healthz and /readyz; \"0\" disables them. [$HEALTH_ADDR]")
	fs.BoolVar(&o.LeaderElection, "leader-elect", false, "Elect a leader among replicas; only the leader reconciles, every replica serves the webhook.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-elect-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the leader-election Lease; empty means the namespace the controller runs in. [$POD_NAMESPACE]")
	fs.StringVar(&o.LeaderElectionID, "leader-elect-id", controller.DefaultLeaderElectionID, "Name of the leader-election Lease.")
	fs.BoolVar(&f.releaseFinalizers, "release-finalizers", false, "Remove the controller's finalizer from every GpuProfile and exit: the chart's pre-delete hook, so helm uninstall leaves no profile stuck.")
	fs.BoolVar(&o.ApplyCRDs, "apply-crds", false, "Apply this version's gpuaas.io CRDs at start (server-side apply; a newer live CRD is left alone). The chart sets it: helm does not upgrade CRDs.")
	fs.StringVar(&o.LedgerNamespace, "quota-ledger-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the quota ledger's ConfigMaps (reservations every replica sees); empty means \"default\". [$POD_NAMESPACE]")
	fs.StringVar(&w.Host, "webhook-host", "", "Address the webhook server listens on; empty means all.")
	fs.IntVar(&w.Port, "webhook-port", controller.DefaultWebhookPort, "Port of the webhook server.")
	fs.StringVar(&w.CertDir, "webhook-cert-dir", filepath.Join(os.TempDir(), "gpuaas-dra-controller", "certs"), "Directory of the webhook's tls.crt and tls.key (written by the controller unless --webhook-external-certs).")
	fs.StringVar(&f.webhookService, "webhook-service", "", "Service in front of the webhook, namespace/name (in-cluster). Exactly one of --webhook-service and --webhook-url.")
	fs.Int32Var(&w.ServicePort, "webhook-service-port", 443, "Port of --webhook-service.")
	fs.StringVar(&w.URL, "webhook-url", "", "URL at which the apiserver reaches the webhook, e.g. https://127.0.0.1:9443 (tests, demo).")
	fs.StringVar(&w.CertSecret, "webhook-cert-secret", "", "Secret (namespace/name) holding the self-signed CA and serving certificate, shared by all replicas; empty: each process makes its own.")
	fs.BoolVar(&w.ExternalCerts, "webhook-external-certs", false, "The certificate in --webhook-cert-dir comes from elsewhere (cert-manager); do not write it.")
	fs.StringVar(&w.CAFile, "webhook-ca-file", "", "With --webhook-external-certs: CA to inject as caBundle; empty leaves the caBundle to its injector.")
	fs.StringVar(&w.ConfigName, "webhook-config-name", controller.DefaultWebhookConfigName, "Name of the ValidatingWebhookConfiguration and the MutatingWebhookConfiguration the controller maintains.")
	fs.BoolVar(&w.ConfigOwnedByChart, "webhook-config-owned-by-chart", false, "The webhook configurations named --webhook-config-name are installed by the Helm chart: only inject the CA bundle into them, never create or delete them.")
	fs.BoolVar(&w.RemoveOnExit, "webhook-remove-on-exit", false, "Delete the webhook configuration on shutdown (demo, tests): with failurePolicy Fail a stopped controller otherwise blocks claims.")
	fs.StringSliceVar(&o.ExemptNamespaces, "exempt-namespaces", nil, "Namespaces besides kube-system, kube-public and kube-node-lease whose claims skip the quota webhook.")
	fs.BoolVar(&o.DenyUnassigned, "deny-unassigned", false, "Refuse claims for GPUs in namespaces no TenantQuota covers.")
	fs.BoolVar(&o.NudgeWaitingPods, "nudge-waiting-pods", true, "When quota frees up, annotate pods whose claims were denied so the kube-controller-manager retries them at once.")
	fs.BoolVar(&o.Kueue, "kueue", false, "Admit the claims of workloads Kueue has admitted even over their tenant's quota, within what Kueue charged the workload (still charged); only claims the kube-controller-manager made for a pod of the workload (--kueue-claim-creators). Needs get/list on workloads.kueue.x-k8s.io.")
	fs.StringSliceVar(&o.KueueClaimCreators, "kueue-claim-creators", controller.DefaultKueueClaimCreators, "With --kueue: the users whose ResourceClaims (made from a pod's templates) may be admitted over quota for a Kueue-admitted workload; a tenant's own claims never are.")
	fs.StringVar(&o.HardwareProfileNamespace, "hardware-profile-namespace", "", "Publish every GpuProfile as an OpenShift AI HardwareProfile (infrastructure.opendatahub.io/v1) in this namespace, and every GpuShape in its tenants' namespaces, where that CRD is served (docs/platform.md, \"OpenShift AI\"); empty publishes none. Needs get/create/update on hardwareprofiles.infrastructure.opendatahub.io there.")
	fs.BoolVar(&o.HardwareProfilesPerTenant, "hardware-profiles-per-tenant", false, "Publish every GpuProfile as a HardwareProfile in each tenant's namespaces too, scheduled as the tenant is: type Queue with a LocalQueue of its Kueue ClusterQueue where the TenantQuota has spec.kueue, type Node otherwise. GpuShapes are published in their tenants' namespaces holding their templates (spec.dra.resourceClaimTemplateName) with this or --hardware-profile-namespace. Needs list on localqueues.kueue.x-k8s.io.")
	fs.BoolVar(&o.QuotaBackstop, "quota-backstop", true, "Keep a ResourceQuota (gpuaas-backstop) in each namespace of a TenantQuota with device limits, so the API server enforces those limits per namespace even if the webhook does not.")
	fs.DurationVar(&o.ReclaimUnallocatedAfter, "reclaim-unallocated-after", controller.DefaultReclaimUnallocatedAfter, "A cohort member refused a claim within its own limits because its quota is lent out gets it back from the borrowers' ResourceClaims that have stayed unallocated for longer than this: they are deleted (a pod's claim is made again and waits for quota). 0: lenders wait until the borrowers give quota back. Needs delete on resourceclaims.")
	fs.BoolVar(&o.IdlePolicy, "idle-policy", true, "Enforce the idle policies of TenantQuotas and GpuProfiles (spec.idlePolicy) on allocated claims whose devices the plugins report idle: warn, then notify, deactivate the Kueue Workload or evict the pods (docs/idle-policy.md). The plugins' use Leases are read in --quota-ledger-namespace. Needs create on pods/eviction, get on pods and leases, patch on Kueue Workloads for Deactivate.")
	fs.StringVar(&o.BillingCurrency, "billing-currency", "USD", "The currency of the prices on GpuProfiles and GpuShapes (spec.price) and of the TenantUsage records and cost metrics (docs/platform.md, \"Billing\").")
	fs.IntVar(&o.BillingRetentionMonths, "billing-retention-months", 13, "Delete a tenant's TenantUsage (its month's billing records) once the month ended more than this many months before the current one; the current and the previous month are always kept, and the deleted months stay in the billing counters until the leader restarts. 0 keeps every month. Needs delete on tenantusages.")
	fs.DurationVar(&o.Resync, "resync", 0, "How often quota status is refreshed and the open billing records' lastSeen written without changes; default 30s.")
	cli.Parse(fs, "dra-controller keeps the GPU catalog (GpuProfile -> DeviceClass) and charges\nResourceClaims against TenantQuotas (driver gpu.gpuaas.io).")
	return f
}

func run(ctx context.Context, f *flags) error {
	if f.webhookService != "" {
		ns, name, ok := strings.Cut(f.webhookService, "/")
		if !ok {
			return fmt.Errorf("--webhook-service %q: want namespace/name", f.webhookService)
		}
		f.opts.Webhook.ServiceNamespace, f.opts.Webhook.ServiceName = ns, name
	}
	cfg, err := restConfig(f.kubeconfig)
	if err != nil {
		return err
	}
	if f.releaseFinalizers {
		return controller.ReleaseFinalizers(ctx, cfg)
	}
	controller.SetMemoryLimit(ctx)
	return controller.Run(ctx, cfg, f.opts)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration (or set --kubeconfig): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
