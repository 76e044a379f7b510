package prepare

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
)

// configKinds says which opaque configuration kind fits which device type.
var configKinds = map[device.DeviceType]string{
	device.TypeGPU:       configapi.GpuConfigKind,
	device.TypeMIG:       configapi.MigConfigKind,
	device.TypeTimeSlice: configapi.GpuConfigKind,
	device.TypeShared:    configapi.GpuConfigKind,
}

// opaqueConfig is one decoded configuration entry and the requests it
// targets (none: every request of the claim).
type opaqueConfig struct {
	requests  []string
	config    configapi.Interface
	fromClass bool // the admin's (the DeviceClass's), not the claim's
}

// decodeConfigs decodes every configuration for our driver in priority order:
// class configs first, then claim configs, each in the order written, so
// that the last one that matches a device wins. The MPS limits of class
// configs are also caps that a claim's config cannot raise (classCapsFor).
func decodeConfigs(configs []resourceapi.DeviceAllocationConfiguration) ([]opaqueConfig, error) {
	ordered := slices.Clone(configs)
	slices.SortStableFunc(ordered, func(a, b resourceapi.DeviceAllocationConfiguration) int {
		return cmp.Compare(sourceRank(a.Source), sourceRank(b.Source))
	})
	var out []opaqueConfig
	for i, c := range ordered {
		if c.Opaque == nil || c.Opaque.Driver != configapi.DriverName {
			continue
		}
		cfg, err := configapi.Decode(c.Opaque.Parameters.Raw)
		if err != nil {
			return nil, fmt.Errorf("config %d (from %s): %w", i, c.Source, err)
		}
		out = append(out, opaqueConfig{requests: c.Requests, config: cfg, fromClass: c.Source == resourceapi.AllocationConfigSourceClass})
	}
	return out, nil
}

func sourceRank(s resourceapi.AllocationConfigSource) int {
	if s == resourceapi.AllocationConfigSourceClass {
		return 0
	}
	return 1
}

// configFor picks the configuration of one allocated device: the last entry
// that targets its request (or all requests) and whose kind fits the device.
// An entry that names the request explicitly but has the wrong kind is an
// error: the user asked for something that cannot apply.
func configFor(configs []opaqueConfig, request string, t device.DeviceType) (configapi.Interface, error) {
	want := configKinds[t]
	var chosen configapi.Interface
	for _, c := range configs {
		explicit := len(c.requests) > 0
		if explicit && !targets(c.requests, request) {
			continue
		}
		kind := c.config.GetObjectKind().GroupVersionKind().Kind
		if kind != want {
			if explicit {
				return nil, fmt.Errorf("request %q: a %s cannot configure a device of type %q (want %s)", request, kind, t, want)
			}
			continue
		}
		chosen = c.config
	}
	if chosen == nil {
		return defaultConfig(t), nil
	}
	return chosen, nil
}

// classCapsFor is the MPS limits the class's config sets for one
// allocated device: of the last class entry that targets its request and
// fits the device and sets any; nil for none. The admin sells those, so a
// claim's config may only lower them (device.planMPS).
func classCapsFor(configs []opaqueConfig, request string, t device.DeviceType) *configapi.MpsConfig {
	var caps *configapi.MpsConfig
	for _, c := range configs {
		if !c.fromClass || (len(c.requests) > 0 && !targets(c.requests, request)) ||
			c.config.GetObjectKind().GroupVersionKind().Kind != configKinds[t] {
			continue
		}
		if m := configapi.MPSConfigOf(c.config); m != nil {
			caps = m
		}
	}
	return caps
}

// defaultConfig is what a device gets when no config names it: replicas
// and shares of a GPU get their GPU's settings (no strategy of their own),
// the rest exclusive access.
func defaultConfig(t device.DeviceType) configapi.Interface {
	cfg := configapi.DefaultGpuConfig()
	if t == device.TypeTimeSlice || t == device.TypeShared {
		cfg.Sharing.Strategy = ""
	}
	return cfg
}

// targets reports whether a config's request list names the request. A
// result of a firstAvailable subrequest is named "parent/sub"; a config may
// name either.
func targets(requests []string, request string) bool {
	parent, _, _ := strings.Cut(request, "/")
	return slices.Contains(requests, request) || slices.Contains(requests, parent)
}
