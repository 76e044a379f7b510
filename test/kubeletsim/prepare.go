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
// prepared. It returns the CDI device IDs per ResourceClaim name.
func (s *Simulator) prepare(ctx context.Context, pod *v1.Pod) (map[string][]string, error) {
	fresh, err := s.podClaims(ctx, pod)
	if err != nil {
		return nil, err
	}
	infos, todo, err := s.attach(pod.UID, fresh)
	if err != nil {
		return nil, err
	}
	batches := groupByDriver(todo, resourceapi.SkipNodeOperationNodePrepareResources)
	for _, driver := range sortedKeys(batches) {
		if err := s.callPrepare(ctx, driver, batches[driver], todo); err != nil {
			return nil, err
		}
	}
	s.claims.mu.Lock()
	defer s.claims.mu.Unlock()
	cdi := map[string][]string{}
	for _, info := range todo {
		info.Prepared = true
	}
	for _, info := range infos {
		if ids := info.CDIDeviceIDs(); len(ids) > 0 {
			cdi[info.Name] = ids
		}
	}
	return cdi, nil
}

// podClaims fetches the pod's claims from the API server (not a cache: the
// allocation must be current) and validates them as the kubelet does.
func (s *Simulator) podClaims(ctx context.Context, pod *v1.Pod) ([]*claimInfo, error) {
	var out []*claimInfo
	for i := range pod.Spec.ResourceClaims {
		name, mustCheckOwner, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			return nil, err
		}
		if name == nil {
			continue // no claim was generated for this entry; nothing to do
		}
		claim, err := s.cfg.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("fetch ResourceClaim %s: %w", *name, err)
		}
		if err := s.checkClaim(pod, claim, mustCheckOwner); err != nil {
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
		out = append(out, info)
	}
	return out, nil
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
// them and those that still need a prepare call.
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
