package kubeletsim

import (
	"context"
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// prepare mirrors the kubelet's PrepareResources: look up every claim of the
// pod (it must be allocated and reserved for the pod), check every driver
// is registered before touching anything, record the pod in the claim cache,
// then call NodePrepareResources once per driver for the claims not yet
// prepared. It returns the CDI device IDs per claim and per container.
func (s *Simulator) prepare(ctx context.Context, pod *v1.Pod) (podCDI, error) {
	refs, err := claimRefs(pod)
	if err != nil {
		return podCDI{}, err
	}
	fresh, err := s.podClaims(ctx, pod, refs)
	if err != nil {
		return podCDI{}, err
	}
	infos, todo, err := s.attach(pod.UID, fresh)
	if err != nil {
		return podCDI{}, err
	}
	batches := groupByDriver(todo, resourceapi.SkipNodeOperationNodePrepareResources)
	for _, driver := range sortedKeys(batches) {
		if err := s.callPrepare(ctx, driver, batches[driver], todo); err != nil {
			return podCDI{}, err
		}
	}
	s.claims.mu.Lock()
	defer s.claims.mu.Unlock()
	for _, info := range todo {
		info.Prepared = true
	}
	return podCDI{claims: claimCDI(infos), containers: containerCDI(pod, refs, infos)}, nil
}

// claimRef is one claim of a pod, as the kubelet lists them.
type claimRef struct {
	// podClaim is the pod.spec.resourceClaims entry the claim comes from;
	// empty for the extended-resource claim, which has none.
	podClaim string
	name     string
	// checkOwner: the claim was generated for the pod, so the pod must be
	// its controller.
	checkOwner bool
	extended   bool
}

// claimRefs lists the claims of pod.spec.resourceClaims that exist, then the
// one the scheduler created for the pod's extended resources (KEP-5004),
// which the pod spec does not list: the kubelet prepares it like the others.
func claimRefs(pod *v1.Pod) ([]claimRef, error) {
	var refs []claimRef
	for i := range pod.Spec.ResourceClaims {
		podClaim := &pod.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(pod, podClaim)
		if err != nil {
			return nil, err
		}
		if name == nil {
			continue // no claim was generated for this entry; nothing to do
		}
		refs = append(refs, claimRef{podClaim: podClaim.Name, name: *name, checkOwner: mustCheckOwner})
	}
	if ref, ok := extendedClaimRef(pod); ok {
		refs = append(refs, ref)
	}
	return refs, nil
}

// podClaims fetches the pod's claims from the API server (not a cache: the
// allocation must be current) and validates them as the kubelet does. The
// result is in the order of refs.
func (s *Simulator) podClaims(ctx context.Context, pod *v1.Pod, refs []claimRef) ([]*claimInfo, error) {
	out := make([]*claimInfo, 0, len(refs))
	for _, ref := range refs {
		info, err := s.podClaim(ctx, pod, ref)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

func (s *Simulator) podClaim(ctx context.Context, pod *v1.Pod, ref claimRef) (*claimInfo, error) {
	claim, err := s.cfg.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, ref.name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("fetch ResourceClaim %s: %w", ref.name, err)
	}
	if err := s.checkClaim(pod, claim, ref.checkOwner); err != nil {
		return nil, err
	}
	info, err := newClaimInfo(claim)
	if err != nil {
		return nil, fmt.Errorf("ResourceClaim %s: %w", claim.Name, err)
	}
	for _, driver := range info.driversFor(resourceapi.SkipNodeOperationNodePrepareResources) {
		if _, err := s.plugins.get(driver); err != nil {
			return nil, err
		}
	}
	return info, nil
}

func (s *Simulator) checkClaim(pod *v1.Pod, claim *resourceapi.ResourceClaim, mustCheckOwner bool) error {
	if mustCheckOwner {
		if err := resourceclaim.IsForPod(pod, claim, false); err != nil {
			return err
		}
	}
	if !resourceclaim.IsReservedForPod(pod, claim, false) {
		return fmt.Errorf("pod %s (%s) is not allowed to use ResourceClaim %s (%s)", pod.Name, pod.UID, claim.Name, claim.UID)
	}
	return nil
}

// attach adds the pod to the cache entries of its claims; it returns all of
// them, in the order of fresh, and those that still need a prepare call.
func (s *Simulator) attach(pod types.UID, fresh []*claimInfo) (all, todo []*claimInfo, err error) {
	s.claims.mu.Lock()
	defer s.claims.mu.Unlock()
	for _, f := range fresh {
		info, err := s.claims.attach(f, pod)
		if err != nil {
			return nil, nil, err
		}
		all = append(all, info)
		if !info.Prepared {
			todo = append(todo, info)
		}
	}
	return all, todo, nil
}

// callPrepare makes one NodePrepareResources call and stores the devices of
// each claim. A per-claim error fails the whole pod, as in the kubelet.
func (s *Simulator) callPrepare(ctx context.Context, driver string, batch []*drapb.Claim, infos []*claimInfo) error {
	p, err := s.plugins.get(driver)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, pluginCallTimeout)
	defer cancel()
	resp, err := p.client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: batch})
	if err != nil {
		return fmt.Errorf("NodePrepareResources: %w", err)
	}
	s.claims.mu.Lock()
	defer s.claims.mu.Unlock()
	for uid, result := range resp.Claims {
		info := findInfo(infos, uid)
		if info == nil {
			return fmt.Errorf("NodePrepareResources returned result for unknown claim UID %s", uid)
		}
		if result.GetError() != "" {
			return fmt.Errorf("NodePrepareResources failed for ResourceClaim %s: %s", info.Name, result.Error)
		}
		info.Devices[driver] = result.GetDevices()
	}
	if missing := len(batch) - len(resp.Claims); missing != 0 {
		return fmt.Errorf("NodePrepareResources skipped %d ResourceClaims", missing)
	}
	return nil
}

// unprepare mirrors the kubelet's UnprepareResources for a pod: claims that
// other pods on the node still use only lose the reference; the others get
// NodeUnprepareResources and are forgotten once every driver succeeded.
func (s *Simulator) unprepare(ctx context.Context, pod types.UID) error {
	s.claims.mu.Lock()
	last := s.claims.detach(pod)
	s.claims.mu.Unlock()
	batches := groupByDriver(last, resourceapi.SkipNodeOperationNodeUnprepareResources)
	for _, driver := range sortedKeys(batches) {
		if err := s.callUnprepare(ctx, driver, batches[driver], last); err != nil {
			return err
		}
	}
	s.claims.mu.Lock()
	s.claims.remove(last)
	s.claims.mu.Unlock()
	return nil
}

func (s *Simulator) callUnprepare(ctx context.Context, driver string, batch []*drapb.Claim, infos []*claimInfo) error {
	p, err := s.plugins.get(driver)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, pluginCallTimeout)
	defer cancel()
	resp, err := p.client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: batch})
	if err != nil {
		return fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	for uid, result := range resp.Claims {
		info := findInfo(infos, uid)
		if info == nil {
			return fmt.Errorf("NodeUnprepareResources returned result for unknown claim UID %s", uid)
		}
		if result.GetError() != "" {
			return fmt.Errorf("NodeUnprepareResources failed for ResourceClaim %s: %s", info.Name, result.Error)
		}
	}
	if missing := len(batch) - len(resp.Claims); missing != 0 {
		return fmt.Errorf("NodeUnprepareResources skipped %d ResourceClaims", missing)
	}
	return nil
}

func findInfo(infos []*claimInfo, uid string) *claimInfo {
	for _, info := range infos {
		if string(info.UID) == uid {
			return info
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
