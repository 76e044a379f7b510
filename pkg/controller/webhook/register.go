package webhook

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
)

// Register serves the webhooks on the manager's webhook server: the quota
// webhook decides with acct, remembers the pods of denied claims in nudge,
// and asks gate (nil without the Kueue integration) about the claims it
// denies; shapes refuses claims of a shape none of which can be placed
// (whenUnavailable: Refuse); exempt are the configured exempt namespaces,
// besides the defaults.
func Register(mgr manager.Manager, acct *quotaadmission.Accountant, nudge *quotaadmission.Nudger, gate *quotaadmission.KueueGate,
	shapes ShapeGate, exempt []string) error {
	dc, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("creating the discovery client for the server version: %w", err)
	}
	server := &serverMinor{discovery: dc}
	if err := mgr.Add(server); err != nil {
		return fmt.Errorf("adding the server version watch: %w", err)
	}
	dec := admission.NewDecoder(mgr.GetScheme())
	skip := exemptNamespaces(exempt)
	srv := mgr.GetWebhookServer()
	srv.Register(pathClaim, &admission.Webhook{Handler: &claimWebhook{
		exempt: sets.New(skip...), acct: acct, decoder: dec, nudger: nudge, kueue: gate, shapes: shapes, recorder: mgr.GetEventRecorder("gpuaas-dra-controller"),
		server: server, classes: mgr.GetClient(), shares: acct,
	}})
	srv.Register(pathAlternatives, &admission.Webhook{Handler: &alternativesWebhook{
		exempt: sets.New(skip...), acct: acct, decoder: dec,
	}})
	srv.Register(pathTemplate, &admission.Webhook{Handler: &templateWebhook{decoder: dec, server: server, classes: mgr.GetClient(), shares: acct}})
	srv.Register(pathProfile, &admission.Webhook{Handler: &profileWebhook{acct: acct, decoder: dec}})
	srv.Register(pathQuota, &admission.Webhook{Handler: &quotaWebhook{acct: acct, decoder: dec}})
	return nil
}
