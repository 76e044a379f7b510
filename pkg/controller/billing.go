package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// billing integrates each tenant's allocated GPU units over time into the
// gpu-unit-seconds counter: units are constant between two observations
// (every change of a tenant's claims triggers one, and the resync bounds
// the gap).
//
// Only the leader observes, so a new leader used to start each tenant's
// integral afresh and the interval since the old leader's last
// observation was never billed. The leader now keeps its last observations
// in a ConfigMap (billingCheckpointName, every resync and when it stops),
// and a new leader starts from them: the gap is billed at the units last
// observed. A graceful handover bills nothing twice; after a crash, what
// the old leader counted since its last checkpoint (at most one resync) is
// counted again.
type billing struct {
	mu   sync.Mutex
	last map[string]billingPoint
	// store keeps the observations across leaders; nil in tests of
	// other parts.
	store    *billingStore
	restored bool
}

type billingPoint struct {
	units quota.Units
	at    time.Time
}

func newBilling() *billing { return &billing{last: map[string]billingPoint{}} }

func (b *billing) observe(ctx context.Context, tenant string, units quota.Units, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.restoreLocked(ctx)
	if p, ok := b.last[tenant]; ok && now.After(p.at) {
		unitSeconds.WithLabelValues(tenant).Add(p.units.Float64() * now.Sub(p.at).Seconds())
	}
	b.last[tenant] = billingPoint{units: units, at: now}
}

func (b *billing) forget(ctx context.Context, tenant string, now time.Time) {
	b.observe(ctx, tenant, quota.Units{}, now)
	b.mu.Lock()
	delete(b.last, tenant)
	b.mu.Unlock()
}

// restoreLocked starts from the previous leader's observations, once.
func (b *billing) restoreLocked(ctx context.Context) {
	if b.store == nil || b.restored {
		return
	}
	points, err := b.store.load(ctx)
	if err != nil {
		// Billing goes on from now; the gap since the last leader is lost,
		// as it always was.
		klog.FromContext(ctx).Error(err, "Reading the billing checkpoint failed; billing from now")
	}
	for tenant, p := range points {
		if _, ok := b.last[tenant]; !ok {
			b.last[tenant] = p
		}
	}
	b.restored = true
}

func (b *billing) snapshot() map[string]billingPoint {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.last)
}

// billingCheckpointName is the ConfigMap, in the controller's namespace,
// of the leader's last observation per tenant.
const billingCheckpointName = "gpuaas-billing-checkpoint"

type billingStore struct {
	client client.Client // uncached
	key    types.NamespacedName
}

// checkpointEntry is one tenant's last observation, exact.
type checkpointEntry struct {
	Units string    `json:"units"`
	At    time.Time `json:"at"`
}

func (s *billingStore) load(ctx context.Context) (map[string]billingPoint, error) {
	var cm corev1.ConfigMap
	err := s.client.Get(ctx, s.key, &cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading billing checkpoint %s: %w", s.key, err)
	}
	var entries map[string]checkpointEntry
	if err := json.Unmarshal([]byte(cm.Data["checkpoint"]), &entries); err != nil {
		return nil, fmt.Errorf("decoding billing checkpoint %s: %w", s.key, err)
	}
	out := make(map[string]billingPoint, len(entries))
	for tenant, e := range entries {
		u, err := quota.ParseUnits(e.Units)
		if err != nil {
			return nil, fmt.Errorf("billing checkpoint %s, tenant %s: %w", s.key, tenant, err)
		}
		out[tenant] = billingPoint{units: u, at: e.At}
	}
	return out, nil
}

func (s *billingStore) save(ctx context.Context, points map[string]billingPoint) error {
	entries := make(map[string]checkpointEntry, len(points))
	for tenant, p := range points {
		entries[tenant] = checkpointEntry{Units: p.units.Exact(), At: p.at}
	}
	raw, err := json.Marshal(entries)
	if err != nil {
		return fmt.Errorf("encoding billing checkpoint: %w", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.key.Namespace, Name: s.key.Name,
		Labels: map[string]string{managedByLabel: managedByController}}}
	err = s.client.Get(ctx, s.key, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm.Data = map[string]string{"checkpoint": string(raw)}
		err = s.client.Create(ctx, cm)
	case err == nil:
		cm.Data = map[string]string{"checkpoint": string(raw)}
		err = s.client.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("writing billing checkpoint %s: %w", s.key, err)
	}
	return nil
}

// billingCheckpointer writes the leader's observations every period and
// when the leader stops.
type billingCheckpointer struct {
	billing *billing
	period  time.Duration
}

func (c *billingCheckpointer) NeedLeaderElection() bool { return true }

func (c *billingCheckpointer) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("billing-checkpoint")
	save := func(ctx context.Context) {
		c.billing.mu.Lock()
		c.billing.restoreLocked(ctx) // never overwrite the last leader's before reading it
		c.billing.mu.Unlock()
		if err := c.billing.store.save(ctx, c.billing.snapshot()); err != nil {
			logger.Error(err, "Writing the billing checkpoint failed")
		}
	}
	t := time.NewTicker(c.period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			save(sctx)
			cancel()
			return nil
		case <-t.C:
			save(ctx)
		}
	}
}
