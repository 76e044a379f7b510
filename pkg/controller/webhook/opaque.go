package webhook

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

// validateOpaque decodes every opaque configuration meant for our driver
// with the plugin's strict decoder, so a typo fails at `kubectl apply`
// instead of at pod start. Other drivers' configurations are theirs.
func validateOpaque(path *field.Path, configs []resourceapi.DeviceClaimConfiguration) field.ErrorList {
	var errs field.ErrorList
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != gpuapi.DriverName {
			continue
		}
		if _, err := gpuapi.Decode(c.Opaque.Parameters.Raw); err != nil {
			errs = append(errs, field.Invalid(path.Index(i).Child("opaque", "parameters"), string(c.Opaque.Parameters.Raw), err.Error()))
		}
	}
	return errs
}

// withinClassCaps refuses a claim's MPS limits above those its requests'
// DeviceClasses set in their config (the admin's caps, which the plugin
// enforces again at prepare), so that a tenant learns at creation, with
// the cap named, rather than at pod start. The limits of a device's share
// are known only once it is allocated: the plugin checks those. A class
// that does not exist is not judged here: the claim cannot be allocated.
// The configs were decoded by validateOpaque.
func withinClassCaps(ctx context.Context, classes client.Reader, path *field.Path, spec resourceapi.DeviceClaim) (field.ErrorList, error) {
	if classes == nil {
		return nil, nil
	}
	var errs field.ErrorList
	for _, m := range mpsConfigsAsked(spec.Config) {
		for _, name := range classNames(spec.Requests, m.config.Requests) {
			caps, err := classMPSCaps(ctx, classes, name, m.kind)
			if err != nil {
				return nil, err
			}
			if err := m.asked.WithinCaps(caps, fmt.Sprintf("the config of DeviceClass %q", name)); err != nil {
				errs = append(errs, m.invalid(path, err))
				break
			}
		}
	}
	return errs, nil
}

// mpsConfigAsked is one of a claim's configs for our driver that asks for
// MPS limits: its index in spec.config, its kind and the limits asked.
type mpsConfigAsked struct {
	index  int
	config resourceapi.DeviceClaimConfiguration
	kind   string
	asked  *gpuapi.MpsConfig
}

// mpsConfigsAsked are the configs for our driver that ask for MPS limits;
// those that do not decode were refused by validateOpaque already.
func mpsConfigsAsked(configs []resourceapi.DeviceClaimConfiguration) []mpsConfigAsked {
	var out []mpsConfigAsked
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != gpuapi.DriverName {
			continue
		}
		cfg, err := gpuapi.Decode(c.Opaque.Parameters.Raw)
		if err != nil {
			continue
		}
		if asked := gpuapi.MPSConfigOf(cfg); asked != nil {
			out = append(out, mpsConfigAsked{index: i, config: c, kind: cfg.GetObjectKind().GroupVersionKind().Kind, asked: asked})
		}
	}
	return out
}

// invalid is the field error for limits above a cap.
func (m mpsConfigAsked) invalid(path *field.Path, err error) *field.Error {
	return field.Invalid(path.Index(m.index).Child("opaque", "parameters"), string(m.config.Opaque.Parameters.Raw), err.Error())
}

// classNames are the DeviceClasses of the requests a config targets
// (targets empty: every request), firstAvailable subrequests included.
func classNames(requests []resourceapi.DeviceRequest, targets []string) []string {
	var out []string
	for _, r := range targetedRequests(requests, targets) {
		out = append(out, r.class)
	}
	return out
}

// classMPSCaps are the MPS limits the last of the class's configs for our
// driver of the given kind sets, as the plugin reads them; nil for none.
func classMPSCaps(ctx context.Context, classes client.Reader, name, kind string) (*gpuapi.MpsConfig, error) {
	var dc resourceapi.DeviceClass
	if err := classes.Get(ctx, client.ObjectKey{Name: name}, &dc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading DeviceClass %s: %w", name, err)
	}
	var caps *gpuapi.MpsConfig
	for _, c := range dc.Spec.Config {
		if c.Opaque == nil || c.Opaque.Driver != gpuapi.DriverName {
			continue
		}
		cfg, err := gpuapi.Decode(c.Opaque.Parameters.Raw)
		if err != nil || cfg.GetObjectKind().GroupVersionKind().Kind != kind {
			continue // the plugin refuses a bad class config at prepare
		}
		if m := gpuapi.MPSConfigOf(cfg); m != nil {
			caps = m
		}
	}
	return caps, nil
}
