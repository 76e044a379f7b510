package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
)

// namespace holds every claim; admin access needs its label.
const namespace = "peer"

func createNamespace(ctx context.Context) error {
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   namespace,
		Labels: map[string]string{"resource.kubernetes.io/admin-access": "true"},
	}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	return nil
}

// createClaim makes a claim allocated to one device of driver d on pool
// and reserved for a pod, as the scheduler leaves it: what the kubelet
// finds before it calls NodePrepareResources. Admin access lets any number
// of background claims sit on 8 GPUs, as many monitoring claims would;
// both plugins prepare such a claim as they prepare any other.
func createClaim(ctx context.Context, d *driver, name, pool, device string, admin bool) (*drapb.Claim, error) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: d.name, AdminAccess: adminPtr(admin),
			}}},
		}},
	}
	created, err := cp.Client.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating claim %s: %w", name, err)
	}
	created.Status = resourceapi.ResourceClaimStatus{
		Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: d.name, Pool: pool, Device: device, AdminAccess: adminPtr(admin),
			}},
		}},
		ReservedFor: []resourceapi.ResourceClaimConsumerReference{{
			Resource: "pods", Name: "pod-" + name, UID: types.UID("pod-" + string(created.UID)),
		}},
	}
	if _, err := cp.Client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("allocating claim %s: %w", name, err)
	}
	return &drapb.Claim{Namespace: namespace, Name: name, Uid: string(created.UID)}, nil
}

func adminPtr(admin bool) *bool {
	if !admin {
		return nil
	}
	return ptr.To(true)
}

// createClaims makes n claims named prefix-i on devices in turn, a few at
// a time (the API server, not the plugins, is what this waits for).
func createClaims(ctx context.Context, d *driver, prefix, pool string, devices []string, n int, admin bool) ([]*drapb.Claim, error) {
	out := make([]*drapb.Claim, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = createClaim(ctx, d, fmt.Sprintf("%s-%d", prefix, i), pool, devices[i%len(devices)], admin)
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// prepare calls NodePrepareResources with claims and returns how long the
// call took; a claim's error fails it.
func (d *driver) prepare(ctx context.Context, claims ...*drapb.Claim) (time.Duration, error) {
	start := time.Now()
	resp, err := d.client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("%s: NodePrepareResources: %w", d.label, err)
	}
	for _, c := range claims {
		r, ok := resp.Claims[c.Uid]
		switch {
		case !ok:
			return took, fmt.Errorf("%s: no answer for claim %s", d.label, c.Name)
		case r.Error != "":
			return took, fmt.Errorf("%s: preparing claim %s: %s", d.label, c.Name, r.Error)
		}
	}
	return took, nil
}

// unprepare is prepare's counterpart.
func (d *driver) unprepare(ctx context.Context, claims ...*drapb.Claim) (time.Duration, error) {
	start := time.Now()
	resp, err := d.client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("%s: NodeUnprepareResources: %w", d.label, err)
	}
	for _, c := range claims {
		if r, ok := resp.Claims[c.Uid]; !ok || r.Error != "" {
			return took, fmt.Errorf("%s: unpreparing claim %s: %v", d.label, c.Name, r)
		}
	}
	return took, nil
}

// prepareInBatches prepares claims a batch per call, as a kubelet with
// many pods would, to fill the node before a measurement.
func (d *driver) prepareInBatches(ctx context.Context, claims []*drapb.Claim, batch int) error {
	for len(claims) > 0 {
		n := min(batch, len(claims))
		if _, err := d.prepare(ctx, claims[:n]...); err != nil {
			return err
		}
		claims = claims[n:]
	}
	return nil
}
