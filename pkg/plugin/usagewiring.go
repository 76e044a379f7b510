package plugin

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/usage"
)

// newSampler is the use sampler of the options; nil where sampling is off.
func newSampler(opts Options, d *Driver) *usage.Sampler {
	if opts.Usage.Interval < 0 {
		return nil
	}
	return usage.New(usage.Options{NVML: opts.NVML, ProcRoot: opts.Usage.ProcRoot, Interval: opts.Usage.Interval,
		Window: opts.Usage.Window, Thresholds: opts.Usage.Thresholds, Tenants: opts.Usage.Tenants, Metrics: opts.Usage.Metrics,
		Devices: d.state.DeviceMap,
		// d.status is set before the sampler runs (startUsage).
		Changed: func(uid types.UID) { d.status.idleChanged(uid) }})
}

// trackPrepared has the sampler measure every claim prepared at start.
func (d *Driver) trackPrepared(ctx context.Context) {
	if d.usage == nil {
		return
	}
	records, _, err := d.store.List()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing prepared claims for the use sampler")
		return
	}
	now := time.Now()
	for _, rec := range records {
		d.usage.Track(rec, now)
	}
	if d.client != nil {
		go d.refreshPods(ctx, records)
	}
}

// refreshPods reads again the pods the restored claims are reserved for:
// records written before they held pods have none, and a claim shared by
// pods gains some after its first prepare. In the background: the
// sampler maps by the records' pods meanwhile, and a claim that cannot be
// read keeps them.
func (d *Driver) refreshPods(ctx context.Context, records []*checkpoint.Claim) {
	logger := klog.FromContext(ctx)
	for _, rec := range records {
		claim, err := d.client.ResourceV1().ResourceClaims(rec.Namespace).Get(ctx, rec.Name, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			logger.V(2).Info("Cannot read the pods of a prepared claim; mapping by its record's", "claim", klog.KRef(rec.Namespace, rec.Name), "err", err.Error())
			continue
		}
		if string(claim.UID) == rec.UID {
			d.usage.SetPods(claim.UID, prepare.ReservedPods(claim))
		}
	}
}

// trackClaim has the sampler measure a claim just prepared, and learn the
// pods it is reserved for now (a claim shared by pods is prepared for each).
func (d *Driver) trackClaim(ctx context.Context, claim *resourceapi.ResourceClaim) {
	if d.usage == nil {
		return
	}
	// A claim prepared again (for another of its pods) is tracked: no
	// record to read on the prepare's path.
	if !d.usage.Tracks(claim.UID) {
		rec, err := d.store.Load(string(claim.UID))
		if err != nil {
			klog.FromContext(ctx).Error(err, "Reading the record of a claim for the use sampler", "claim", klog.KObj(claim))
			return
		}
		d.usage.Track(rec, time.Now())
	}
	d.usage.SetPods(claim.UID, prepare.ReservedPods(claim))
}

// startUsage starts sampling and, with a namespace, renewing the use Lease.
func (d *Driver) startUsage(ctx context.Context, opts Options) {
	if d.usage == nil {
		return
	}
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithName("usage"))
	go d.usage.Run(ctx)
	if opts.KubeClient == nil || opts.Usage.Namespace == "" {
		klog.FromContext(ctx).Info("No namespace for the use Lease (set $POD_NAMESPACE): the controller acts on no Idle condition of this node")
		return
	}
	lease := &usage.UseLease{Client: opts.KubeClient, Namespace: opts.Usage.Namespace, Node: opts.NodeName,
		Holder: opts.Usage.Holder, Started: opts.Usage.Started, Interval: d.usage.Interval()}
	go lease.Run(ctx)
}
