package usage

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// UseLease renews the Lease that says this node's samples are fresh
// (gpuaasv1.UseLeasePrefix + node, in the plugin's namespace): the
// controller acts on a device's Idle condition only while it is fresh and
// was acquired before the condition's lastTransitionTime.
type UseLease struct {
	Client    kubernetes.Interface
	Namespace string
	Node      string
	// Holder names this process; Started is when it started (the Lease's
	// acquireTime).
	Holder   string
	Started  time.Time
	Interval time.Duration
}

// Name is the Lease's name.
func (l *UseLease) Name() string { return gpuaasv1.UseLeasePrefix + l.Node }

// Run renews the Lease every interval until ctx ends.
func (l *UseLease) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("lease", klog.KRef(l.Namespace, l.Name()))
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := l.Renew(ctx, time.Now()); err != nil {
			logger.Error(err, "Renewing the use Lease")
		}
	}, l.Interval)
}

// Renew creates or renews the Lease at now. Its duration is three
// intervals: two samples may be missed before it goes stale.
func (l *UseLease) Renew(ctx context.Context, now time.Time) error {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(l.Holder),
		LeaseDurationSeconds: ptr.To(int32((3 * l.Interval).Seconds())),
		AcquireTime:          &metav1.MicroTime{Time: l.Started},
		RenewTime:            &metav1.MicroTime{Time: now},
	}
	lease, err := leases.Get(ctx, l.Name(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.Name(), Namespace: l.Namespace}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating Lease %s/%s: %w", l.Namespace, l.Name(), err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Lease %s/%s: %w", l.Namespace, l.Name(), err)
	}
	lease.Spec = spec
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renewing Lease %s/%s: %w", l.Namespace, l.Name(), err)
	}
	return nil
}
