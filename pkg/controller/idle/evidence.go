package idle

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// ourDevices are the claim's allocated devices of our driver, but those
// given with admin access (a monitoring agent's): they hold the device from
// no one, so acting on them would free nothing.
func ourDevices(claim *resourceapi.ResourceClaim) []resourceapi.DeviceRequestAllocationResult {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []resourceapi.DeviceRequestAllocationResult
	for _, d := range claim.Status.Allocation.Devices.Results {
		if d.Driver == quota.DriverName && !ptr.Deref(d.AdminAccess, false) {
			out = append(out, d)
		}
	}
	return out
}

// idleness is what the plugin reported of a claim idle on all its devices.
type idleness struct {
	// since is when the last of its devices became idle.
	since time.Time
	// use is what the plugin measured, its conditions' messages.
	use string
	// nodes are the nodes (our pools are named after them) whose plugins
	// reported it.
	nodes sets.Set[string]
}

// claimIdleness is the claim's idleness when every one of its devices (ours)
// has Idle=True; otherwise nil and why not (in use, use unknown, no
// condition yet).
func claimIdleness(claim *resourceapi.ResourceClaim, ours []resourceapi.DeviceRequestAllocationResult) (*idleness, string) {
	out := &idleness{nodes: sets.New[string]()}
	var use []string
	for _, d := range ours {
		cond := deviceCondition(claim, d)
		if cond == nil {
			return nil, fmt.Sprintf("device %s/%s has no %s condition", d.Pool, d.Device, gpuaas.DeviceConditionIdle)
		}
		if cond.Status != metav1.ConditionTrue {
			return nil, fmt.Sprintf("device %s/%s is %s=%s (%s: %s)", d.Pool, d.Device, cond.Type, cond.Status, cond.Reason, cond.Message)
		}
		if t := cond.LastTransitionTime.Time; t.After(out.since) {
			out.since = t
		}
		use = append(use, fmt.Sprintf("%s/%s: %s", d.Pool, d.Device, cond.Message))
		out.nodes.Insert(d.Pool)
	}
	out.use = strings.Join(use, "; ")
	return out, ""
}

// deviceCondition is the Idle condition the plugin wrote for device d.
func deviceCondition(claim *resourceapi.ResourceClaim, d resourceapi.DeviceRequestAllocationResult) *metav1.Condition {
	for i := range claim.Status.Devices {
		s := &claim.Status.Devices[i]
		if s.Driver == d.Driver && s.Pool == d.Pool && s.Device == d.Device {
			return meta.FindStatusCondition(s.Conditions, gpuaas.DeviceConditionIdle)
		}
	}
	return nil
}

// samplersCurrent says why the nodes' plugins cannot be believed, "" when
// they can: each node's use Lease (in namespace) exists, is fresh at now,
// and was acquired, by the plugin process that renews it, no later than the
// idleness began. A plugin restarted since has not seen that idleness; a
// Lease gone stale means its samples stopped.
func samplersCurrent(ctx context.Context, c client.Reader, namespace string, idle *idleness, now time.Time) (string, error) {
	for _, node := range sets.List(idle.nodes) {
		name := gpuaas.UseLeasePrefix + node
		var l coordinationv1.Lease
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &l); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Sprintf("node %s's plugin has no use Lease %s/%s: its samples are not known to be current", node, namespace, name), nil
			}
			return "", fmt.Errorf("reading use Lease %s/%s: %w", namespace, name, err)
		}
		if why := leaseStale(&l, idle.since, now); why != "" {
			return fmt.Sprintf("node %s's use Lease %s: %s", node, name, why), nil
		}
	}
	return "", nil
}

func leaseStale(l *coordinationv1.Lease, since, now time.Time) string {
	s := l.Spec
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return "never renewed"
	}
	if expiry := s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second); expiry.Before(now) {
		return fmt.Sprintf("expired at %s: the plugin's samples stopped", expiry.UTC().Format(time.RFC3339))
	}
	if s.AcquireTime == nil {
		return "no acquireTime: when the plugin started is not known"
	}
	if s.AcquireTime.After(since) {
		return fmt.Sprintf("the plugin started at %s, after the idleness it reports began (%s)",
			s.AcquireTime.UTC().Format(time.RFC3339), since.UTC().Format(time.RFC3339))
	}
	return ""
}
