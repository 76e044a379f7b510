package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
)

// The claim webhooks fail closed, so while this controller is down every
// ResourceClaim in a covered namespace is refused, those of other DRA
// drivers (a NIC's, say) included. The controller therefore gives the
// ResourceClaim and ResourceClaimTemplate webhooks a matchCondition that
// keeps away the objects whose every request names only "foreign"
// DeviceClasses: classes that exist and that the quota prices as someone
// else's. Everything else still reaches the webhook: a claim naming one of
// our classes, a class that does not exist (yet: the quota prices it as a
// GPU), or no class at all.
//
// WebhookConfiguration renders no matchConditions; the chart renders this
// one only for the classes its values name (controller.webhook.
// foreignClasses, the same expression: ForeignMatchCondition), so that
// their claims skip the webhook from the first install and after `helm
// upgrade --force`. The controller's leader writes its own list at run time
// and keeps it in step with the catalog. Helm leaves it alone on upgrade
// while the rendered condition does not change: helm 3 patches the live
// object with a three-way strategic merge of the old manifest, the new one
// and the live object, and webhooks and their matchConditions merge by
// name, so a condition both manifests render alike (or neither renders) is
// never in the patch (the caBundle survives the same way). A change of the
// values' list, or `helm upgrade --force`, puts the chart's list back until
// the leader's next resync; without the values' list, --force drops the
// condition and every claim is sent again meanwhile.
//
// Ordering, so that a name is off the list no later than it becomes ours:
//   - A class is listed only while the leader's cache shows it existing,
//     not being deleted, with selectors, and priced as someone else's by the
//     same Pricer the webhook charges claims with (foreignClass); the first
//     sync after any of that stops holding drops it. Syncs start on the
//     first event and coalesce what comes during one (syncInterval).
//   - The controller's own way of making a name ours, rendering a
//     GpuProfile's DeviceClass, first takes the name off the live list and
//     creates the class only once that is written (profileReconciler's
//     beforeCreate calls Exclude). A class the controller renders is never
//     listed while it exists.
//   - A GpuProfile named like a foreign class makes the name ours for the
//     pricer at once, and the list drops it on the profile's event; claims
//     created in between still get the foreign class's devices, since the
//     profile controller renders nothing over a class it does not own.
//   - What other hands do is seen only when its event arrives: a
//     DeviceClass created or edited to select our devices, or new
//     ResourceSlices that a listed class's selectors match. A claim created
//     in that window (about a second; longer while no leader is elected) is
//     not reviewed, but it is still counted in its tenant's usage as soon as
//     it exists, so quota is over-run by those claims, never escaped for
//     good. The webhook itself lags such changes too, by its informers: it
//     prices a claim by the catalog its cache shows at the claim's creation.
//   - While the controller is down the list stays as last written: what it
//     did not see happen is picked up by the first sync of the next leader.
//
// Fail safe: when the list cannot be computed, or is too long for one CEL
// expression, the condition is removed and every claim is sent.

// foreignConditionName names the matchCondition. The apiserver reports it
// (metrics, audit) for a request it did not send.
const foreignConditionName = "gpuaas.io/not-only-foreign-classes"

// conditionedWebhooks get the condition, with the path of the object's
// ResourceClaimSpec in CEL.
var conditionedWebhooks = []struct{ name, spec string }{
	{webhookClaims, "object.spec"},
	{webhookTemplates, "object.spec.spec"},
}

// Limits of the foreign list. The apiserver's CEL parser refuses an
// expression over 100,000 code points, and every apiserver compiles the
// configuration; above either limit the condition is dropped.
const (
	maxForeignClasses   = 2000
	maxConditionCodePts = 90_000
)

// syncInterval is the least time between two syncs: a burst of slice or
// class events costs one more sync, not one each.
const syncInterval = time.Second

// foreignCondition is the matchCondition for a webhook whose objects keep
// their ResourceClaimSpec at spec; ok is false when no condition is wanted
// (no foreign class, or too many). Names are quoted as CEL string literals,
// whatever they contain.
func foreignCondition(spec string, foreign []string) (admissionregv1.MatchCondition, bool) {
	if len(foreign) == 0 || len(foreign) > maxForeignClasses {
		return admissionregv1.MatchCondition{}, false
	}
	quoted := make([]string, len(foreign))
	for i, name := range foreign {
		quoted[i] = strconv.QuoteToASCII(name) // Go's escapes are CEL's
	}
	expr := sendExpression(spec, strings.Join(quoted, ", "))
	if len(expr) > maxConditionCodePts { // ASCII: bytes are code points
		return admissionregv1.MatchCondition{}, false
	}
	return admissionregv1.MatchCondition{Name: foreignConditionName, Expression: expr}, true
}

// ForeignMatchCondition is the matchCondition the controller gives the
// claim webhook named webhookName (of the ResourceClaims or the
// ResourceClaimTemplates) for the foreign classes, as the chart renders it
// from controller.webhook.foreignClasses (a test compares them); false
// for another webhook or when no condition is wanted.
func ForeignMatchCondition(webhookName string, classes []string) (admissionregv1.MatchCondition, bool) {
	for _, wh := range conditionedWebhooks {
		if wh.name == webhookName {
			return foreignCondition(wh.spec, classes)
		}
	}
	return admissionregv1.MatchCondition{}, false
}

// sendExpression is true unless the object has requests and each of them
// names only classes in the list: an exactly request its class, a
// firstAvailable request every subrequest's. Every field is tested for
// presence and type before use (a claim without requests holds a null
// list): an evaluation error under failurePolicy Fail would refuse the
// object. An object of unexpected shape is sent.
func sendExpression(spec, list string) string {
	var guards []string
	path := "object"
	fields := strings.Split(strings.TrimPrefix(spec+".devices.requests", "object."), ".")
	for i, field := range fields {
		path += "." + field
		kind := "map"
		if i == len(fields)-1 {
			kind = "list"
		}
		guards = append(guards, fmt.Sprintf("has(%s) && type(%s) == %s", path, path, kind))
	}
	const classes = `(has(r.exactly) && type(r.exactly) == map ? [r.exactly] :
      has(r.firstAvailable) && type(r.firstAvailable) == list ? r.firstAvailable : [])`
	return fmt.Sprintf(`!(%s &&
  size(%s) > 0 && %s.all(r, type(r) == map &&
    size(%s) > 0 &&
    %s.all(s, type(s) == map &&
      has(s.deviceClassName) && type(s.deviceClassName) == string &&
      s.deviceClassName in [%s])))`,
		strings.Join(guards, " &&\n  "), path, path, classes, classes, list)
}

// MatchConditionSyncer keeps the conditioned webhooks' matchCondition in
// step with the foreign classes. It runs on the leader only: replicas
// whose caches differ for a moment would otherwise put back a name another
// one just took off.
type MatchConditionSyncer struct {
	client     client.Client // live reads and writes: the configuration is not cached
	foreign    func(context.Context) ([]string, error)
	configName string
	resync     time.Duration

	mu    sync.Mutex // one sync at a time: the loop's and Exclude's
	kick  chan struct{}
	state string // what was last logged, to log changes only
}

// NewMatchConditionSyncer keeps the matchCondition of the configuration
// configName in step with what foreign lists (the accountant's
// ForeignClasses), at least every resync.
func NewMatchConditionSyncer(c client.Client, foreign func(context.Context) ([]string, error), configName string, resync time.Duration) *MatchConditionSyncer {
	return &MatchConditionSyncer{
		client: c, foreign: foreign, configName: configName, resync: resync,
		kick: make(chan struct{}, 1),
	}
}

// Kick asks for a sync.
func (s *MatchConditionSyncer) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *MatchConditionSyncer) NeedLeaderElection() bool { return true }

// Start syncs at once, then on every kick (at most once per syncInterval)
// and every resync, which also repairs a condition someone else removed.
// Failures are retried with back-off.
func (s *MatchConditionSyncer) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("webhook-match-conditions")
	ctx = klog.NewContext(ctx, logger)
	tick := time.NewTicker(s.resync)
	defer tick.Stop()
	s.Kick()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		case <-tick.C:
		}
		wait := syncInterval
		if err := s.sync(ctx, ""); err != nil {
			failures++
			wait = min(syncInterval<<min(failures, 5), s.resync)
			if apierrors.IsNotFound(err) {
				logger.V(2).Info("Webhook configuration not there yet", "name", s.configName)
			} else {
				logger.Error(err, "Syncing the webhooks' matchConditions failed, retrying", "in", wait)
			}
			s.Kick()
		} else {
			failures = 0
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Exclude takes class off the live list, if there, before the caller makes
// it ours (see the ordering above). A configuration that does not exist
// lists nothing.
func (s *MatchConditionSyncer) Exclude(ctx context.Context, class string) error {
	err := s.sync(ctx, class)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// sync writes the condition for the foreign classes, less exclude. When
// they cannot be listed the condition is removed, and the error returned.
func (s *MatchConditionSyncer) sync(ctx context.Context, exclude string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	foreign, listErr := s.foreign(ctx)
	if listErr != nil {
		foreign = nil
	}
	foreign = slices.DeleteFunc(foreign, func(name string) bool { return name == exclude })
	want := map[string]*admissionregv1.MatchCondition{}
	for _, wh := range conditionedWebhooks {
		if mc, ok := foreignCondition(wh.spec, foreign); ok {
			want[wh.name] = &mc
		} else {
			want[wh.name] = nil
		}
	}
	changed, err := s.write(ctx, want)
	if err != nil {
		return errors.Join(listErr, err)
	}
	s.report(ctx, foreign, want, listErr, changed)
	if listErr != nil {
		return fmt.Errorf("computing the foreign DeviceClasses: %w", listErr)
	}
	return nil
}

// write puts the wanted conditions into the live configuration, changing
// nothing else; a webhook the configuration lacks is left out. The RBAC
// grants get and update (not patch) on the configuration: the update
// carries the resourceVersion read, so a concurrent writer (the CA
// injection, cert-controller, helm) makes it conflict and start over.
func (s *MatchConditionSyncer) write(ctx context.Context, want map[string]*admissionregv1.MatchCondition) (bool, error) {
	changed := false
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		var cfg admissionregv1.ValidatingWebhookConfiguration
		if err := s.client.Get(ctx, client.ObjectKey{Name: s.configName}, &cfg); err != nil {
			return err
		}
		changed = false
		for i := range cfg.Webhooks {
			if mc, ok := want[cfg.Webhooks[i].Name]; ok && setMatchCondition(&cfg.Webhooks[i], mc) {
				changed = true
			}
		}
		if !changed {
			return nil
		}
		return s.client.Update(ctx, &cfg)
	})
	if err != nil {
		return false, fmt.Errorf("writing matchConditions of webhook configuration %s: %w", s.configName, err)
	}
	return changed, nil
}

// setMatchCondition makes want (nil: none) the webhook's condition of our
// name, in place, keeping any other; it tells whether anything changed.
func setMatchCondition(wh *admissionregv1.ValidatingWebhook, want *admissionregv1.MatchCondition) bool {
	i := slices.IndexFunc(wh.MatchConditions, func(mc admissionregv1.MatchCondition) bool {
		return mc.Name == foreignConditionName
	})
	switch {
	case i < 0 && want == nil:
		return false
	case i < 0:
		wh.MatchConditions = append(wh.MatchConditions, *want)
	case want == nil:
		wh.MatchConditions = slices.Delete(wh.MatchConditions, i, i+1)
		if len(wh.MatchConditions) == 0 {
			wh.MatchConditions = nil
		}
	case wh.MatchConditions[i] == *want:
		return false
	default:
		wh.MatchConditions[i] = *want
	}
	return true
}

// report logs what the condition says whenever that changes.
func (s *MatchConditionSyncer) report(ctx context.Context, foreign []string, want map[string]*admissionregv1.MatchCondition, listErr error, changed bool) {
	logger := klog.FromContext(ctx)
	var state string
	switch {
	case listErr != nil:
		state = "off: the foreign classes could not be listed"
	case len(foreign) == 0:
		state = "off: no foreign class"
	case want[webhookClaims] == nil:
		state = fmt.Sprintf("off: %d foreign classes are more than one condition holds (at most %d, %d characters)",
			len(foreign), maxForeignClasses, maxConditionCodePts)
	default:
		state = fmt.Sprintf("on: %d foreign classes", len(foreign))
	}
	if state != s.state {
		logger.Info("Claim webhooks' matchCondition for claims naming only foreign DeviceClasses", "state", state,
			"condition", foreignConditionName)
		s.state = state
	}
	if changed {
		logger.V(4).Info("Wrote matchConditions", "foreignClasses", foreign)
	}
}

// WatchForeignClasses syncs the condition when what decides a class's
// foreignness changes: classes, the names of GpuProfiles, and our
// published devices (quotaadmission.CatalogHandler: not a device taint,
// nor another driver's slice). The catalog is invalidated here too: the accountant's
// own handler may run after this one, and the sync must not price with
// the snapshot from before the change (invalidateCatalog is the
// accountant's InvalidateCatalog).
func WatchForeignClasses(ctx context.Context, c cache.Cache, invalidateCatalog func(), s *MatchConditionSyncer) error {
	changed := func() { invalidateCatalog(); s.Kick() }
	names := toolscache.ResourceEventHandlerFuncs{AddFunc: func(any) { changed() }, DeleteFunc: func(any) { changed() }}
	for _, w := range []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{
		// Only what can move a price moves the pricer's verdict.
		{&resourceapi.DeviceClass{}, quotaadmission.CatalogHandler(&resourceapi.DeviceClass{}, changed)},
		{&resourceapi.ResourceSlice{}, quotaadmission.CatalogHandler(&resourceapi.ResourceSlice{}, changed)},
		{&gpuaas.GpuProfile{}, names}, // status writes change no name
	} {
		inf, err := c.GetInformer(ctx, w.obj)
		if err != nil {
			return fmt.Errorf("getting informer for %T: %w", w.obj, err)
		}
		if _, err := inf.AddEventHandler(w.h); err != nil {
			return fmt.Errorf("watching %T: %w", w.obj, err)
		}
	}
	return nil
}

// keepMatchConditions carries our condition over from the live
// configuration when the controller rewrites its webhooks (when it, not
// the chart, owns the configuration): the syncer keeps it, and a replica
// starting must not send every claim again until the next resync.
func keepMatchConditions(want, have *admissionregv1.ValidatingWebhookConfiguration) {
	for i := range want.Webhooks {
		for _, h := range have.Webhooks {
			if h.Name != want.Webhooks[i].Name {
				continue
			}
			for _, mc := range h.MatchConditions {
				if mc.Name == foreignConditionName {
					setMatchCondition(&want.Webhooks[i], &mc)
				}
			}
		}
	}
}
