package webhook

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Candidates lists the published devices a request could be allocated
// (admission.Accountant.Candidates).
type Candidates interface {
	Candidates(ctx context.Context, class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements) ([]quota.Candidate, error)
}

// withinCaps refuses a config's MPS limits above its classes' caps or
// above what its devices' shares of their GPUs allow.
func withinCaps(ctx context.Context, classes client.Reader, shares Candidates, path *field.Path, spec resourceapi.DeviceClaim) (field.ErrorList, error) {
	errs, err := withinClassCaps(ctx, classes, path, spec)
	if err != nil || len(errs) > 0 {
		return errs, err
	}
	return withinShareCaps(ctx, shares, path, spec)
}

// withinShareCaps refuses a config's MPS limits above what the share of
// its GPU that any device its requests can get allows, the cap the plugin
// derives at prepare (a share's memory, and as much of the GPU's threads):
// a 1Gi share of an 80 GB GPU gets 2% of its threads, and a config asking
// 100% is refused at creation rather than at pod start. The bound is the
// most any published candidate allows, so nothing a device would accept is
// refused; a request whose candidates include a device whose cap is not
// known here (a replica, a MIG device) or that has none yet is left to the
// plugin. The configs were decoded by validateOpaque.
func withinShareCaps(ctx context.Context, cands Candidates, path *field.Path, spec resourceapi.DeviceClaim) (field.ErrorList, error) {
	if cands == nil {
		return nil, nil
	}
	var errs field.ErrorList
	for _, m := range mpsConfigsAsked(spec.Config) {
		for _, r := range targetedRequests(spec.Requests, m.config.Requests) {
			found, err := cands.Candidates(ctx, r.class, r.selectors, r.capacity)
			if err != nil {
				return nil, fmt.Errorf("listing the devices request %q can get: %w", r.name, err)
			}
			caps, source, ok := shareCaps(r.name, found)
			if !ok {
				continue
			}
			if err := m.asked.WithinCaps(caps, source); err != nil {
				errs = append(errs, m.invalid(path, err))
				break
			}
		}
	}
	return errs, nil
}

// targetedRequest is one (sub)request a config applies to.
type targetedRequest struct {
	name, class string
	selectors   []resourceapi.DeviceSelector
	capacity    *resourceapi.CapacityRequirements
}

// targetedRequests are the requests a config targets (targets empty: every
// request), firstAvailable subrequests included, as classNames reads them.
func targetedRequests(requests []resourceapi.DeviceRequest, targets []string) []targetedRequest {
	var out []targetedRequest
	for _, r := range requests {
		if r.Exactly != nil && targeted(targets, r.Name) {
			out = append(out, targetedRequest{r.Name, r.Exactly.DeviceClassName, r.Exactly.Selectors, r.Exactly.Capacity})
		}
		for _, sub := range r.FirstAvailable {
			if name := r.Name + "/" + sub.Name; targeted(targets, r.Name) || targeted(targets, name) {
				out = append(out, targetedRequest{name, sub.DeviceClassName, sub.Selectors, sub.Capacity})
			}
		}
	}
	return out
}

func targeted(targets []string, name string) bool {
	return len(targets) == 0 || slices.Contains(targets, name)
}

// shareCaps are the largest MPS limits any of the candidates allows, and
// where they come from; false when they are not known here: no
// candidates, or one whose MPS limits the plugin derives from what only
// the node knows. Shares of GPUs shared without MPS refuse an MPS config
// at prepare whatever it asks, so they bound nothing.
func shareCaps(request string, cands []quota.Candidate) (*gpuapi.MpsConfig, string, bool) {
	threads, mem, total := 0, int64(0), int64(0)
	for _, c := range cands {
		d := c.Device
		var t int
		switch {
		case d.Type == quota.TypeGPU:
			t = 100
		case d.Type == quota.TypeShared && stringAttr(d.Basic, attrSharingStrategy) == string(gpuapi.MPSStrategy) && d.Memory > 0:
			t = int(min(100, max(1, (c.Memory*100+d.Memory-1)/d.Memory)))
		case d.Type == quota.TypeShared:
			continue
		default:
			return nil, "", false
		}
		if t > threads {
			threads, total = t, d.Memory
		}
		mem = max(mem, c.Memory)
	}
	if threads == 0 {
		return nil, "", false
	}
	caps := &gpuapi.MpsConfig{DefaultActiveThreadPercentage: ptr.To(threads), DefaultPinnedDeviceMemoryLimit: resource.NewQuantity(mem, resource.BinarySI)}
	return caps, fmt.Sprintf("the device's share of its GPU: the most request %q can get is %s of a GPU of %s",
		request, resource.NewQuantity(mem, resource.BinarySI), resource.NewQuantity(total, resource.BinarySI)), true
}

// attrSharingStrategy is the attribute that says how a GPU is shared
// (timeslice.AttrSharingStrategy).
const attrSharingStrategy = "sharingStrategy"

// stringAttr reads an attribute by its short or its qualified name.
func stringAttr(d resourceapi.Device, name string) string {
	for _, key := range []resourceapi.QualifiedName{resourceapi.QualifiedName(name), resourceapi.QualifiedName(gpuapi.DriverName + "/" + name)} {
		if a, ok := d.Attributes[key]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	}
	return ""
}
