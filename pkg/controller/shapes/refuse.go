package shapes

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

// Refuser tells the claim webhook which new claims a shape with
// whenUnavailable: Refuse turns away: a claim of the shape while its
// status says none can be placed. A nil Refuser refuses nothing (the
// GpuShape CRD is not installed).
//
// A claim is of a shape when its namespace holds the shape's template
// (status.namespaces, written by the controller) and its spec is the
// template's (shape.SameClaim). Its labels, annotations and owner are the
// tenant's to write and decide nothing.
//
// The count is the shape's status, as the leader last wrote it, not a
// recount at admission; the races this leaves, and why each is safe:
//   - Devices taken since the count (another claim allocated, a device
//     tainted): the claim is admitted and waits for the scheduler, as with
//     Queue. Refuse never admits what the scheduler would not otherwise
//     place; it only stops some waits early.
//   - Devices freed since the count (status still 0 for up to the count's
//     coalescing second plus a reconcile): the claim is refused though one
//     would fit. The kube-controller-manager retries a template's claim
//     with back-off, so the pod gets its claim on a later try; a claim
//     created by hand is retried by its creator. Nothing is over-committed.
//   - Several claims at once while placeable is N > 0: all are admitted
//     and the scheduler places N; the rest wait. Placeable is a forecast,
//     not a reservation: the scheduler is the only allocator, so no count
//     can over-allocate a device.
//   - What the count does not see (cordoned nodes; DeviceTaintRules where
//     resource.k8s.io/v1 does not serve them, before 1.37) makes
//     it too high: such claims are admitted and wait, as with Queue.
type Refuser struct {
	reader client.Reader
}

// Refuse returns why the claim is refused ("unavailable: shape h100-slot
// has 0 placeable (0 of 3 nodes have a free GPU+NIC on one PCIe root)"),
// or "" when it is not.
func (r *Refuser) Refuse(ctx context.Context, claim *resourceapi.ResourceClaim) (string, error) {
	if r == nil {
		return "", nil
	}
	var list gpuaas.GpuShapeList
	if err := r.reader.List(ctx, &list); err != nil {
		return "", fmt.Errorf("listing GpuShapes: %w", err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		if s.UnavailableAction() != gpuaas.Refuse || s.Status.ObservedGeneration == 0 || s.Status.Placeable > 0 ||
			!slices.Contains(s.Status.Namespaces, claim.Namespace) || !shape.SameClaim(s, &claim.Spec) {
			continue
		}
		return fmt.Sprintf("unavailable: shape %s has 0 placeable (%s)", s.Name, s.Status.PlaceableMessage), nil
	}
	return "", nil
}

// NewRefuser reads shapes through reader (the manager's cache).
func NewRefuser(reader client.Reader) *Refuser { return &Refuser{reader: reader} }
