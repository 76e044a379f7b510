package cdi

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// deviceEnvPrefix starts the variable that names one device of a container:
// GPUAAS_DEVICE_<DEVICE NAME>=<GPU or MIG UUID>. One name per device, so the
// variables of all the container's devices, from any number of claims, add
// up to exactly the devices it holds (see withVisibleDevicesVoid).
const deviceEnvPrefix = "GPUAAS_DEVICE_"

// buildSpec assembles the spec of one claim: the common edits and the
// control nodes the host has at spec level; each device's nodes and env at
// device level, so that a container given some of the claim's devices gets
// exactly theirs.
func (h *Handler) buildSpec(claimUID string, devices []Device) (*specs.Spec, error) {
	if err := validateClaimUID(claimUID); err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("no devices")
	}
	log := h.log.WithValues("claimUID", claimUID)
	// One snapshot: a driver upgrade (Refresh) never mixes into a spec.
	df := h.driver.Load()
	control, err := df.nodes.controlNodes(log, df.common.DeviceNodes)
	if err != nil {
		return nil, err
	}
	capsMajor, err := df.nodes.capsMajor(devices)
	if err != nil {
		return nil, err
	}
	spec := &specs.Spec{
		Kind:           Kind,
		Devices:        make([]specs.Device, 0, len(devices)),
		ContainerEdits: df.common,
	}
	// Clipping makes append copy: concurrent writes never share the
	// backing array of the cached common edits.
	spec.ContainerEdits.DeviceNodes = append(slices.Clip(df.common.DeviceNodes), control...)
	if err := checkMemoryLimits(df, devices); err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(devices))
	for _, d := range devices {
		if err := validateDevice(d); err != nil {
			return nil, err
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("duplicate device %q", d.Name)
		}
		seen[d.Name] = true
		dev, err := deviceSpec(log, df, claimUID, d, capsMajor)
		if err != nil {
			return nil, fmt.Errorf("device %q: %w", d.Name, err)
		}
		spec.Devices = append(spec.Devices, dev)
	}
	version, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("compute CDI version: %w", err)
	}
	spec.Version = version
	if err := validate(spec); err != nil {
		return nil, fmt.Errorf("invalid CDI spec: %w", err)
	}
	return spec, nil
}

// validateDevice catches what the CDI library would accept but that would
// give a container the wrong devices.
func validateDevice(d Device) error {
	if d.UUID == "" || d.Minor < 0 {
		return fmt.Errorf("device %q: UUID %q, minor %d: want a UUID and a minor >= 0", d.Name, d.UUID, d.Minor)
	}
	for _, n := range d.ExtraNodes {
		if !filepath.IsAbs(n.Path) {
			return fmt.Errorf("device %q: capability node %q is not an absolute path", d.Name, n.Path)
		}
	}
	for _, m := range d.Mounts {
		if !filepath.IsAbs(m.HostPath) || !filepath.IsAbs(m.ContainerPath) {
			return fmt.Errorf("device %q: mount %q at %q: both must be absolute paths", d.Name, m.HostPath, m.ContainerPath)
		}
	}
	for k := range d.Env {
		if k == visibleDevicesEnv || strings.HasPrefix(k, deviceEnvPrefix) {
			return fmt.Errorf("device %q: %s is the handler's to set", d.Name, k)
		}
	}
	return validateMemoryLimit(d)
}

// deviceEnvName is the variable naming one device: its DRA device name,
// upper case, with what a shell name cannot hold as "_". Two claims holding
// one device (sharing, admin access) write the same name and UUID.
func deviceEnvName(deviceName string) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, deviceName)
	return deviceEnvPrefix + name
}

func deviceSpec(log klog.Logger, df *driverFiles, claimUID string, d Device, capsMajor uint32) (specs.Device, error) {
	checker := df.nodes
	if err := checker.migWithoutCaps(log, d); err != nil {
		return specs.Device{}, err
	}
	nodes := make([]*specs.DeviceNode, 0, 1+len(d.ExtraNodes))
	gpu, err := checker.gpuNode(log, d.Minor)
	if err != nil {
		return specs.Device{}, err
	}
	if gpu != nil {
		nodes = append(nodes, gpu)
	}
	for _, n := range d.ExtraNodes {
		nodes = append(nodes, checker.capNode(capsMajor, n))
	}
	env := maps.Clone(d.Env)
	if env == nil {
		env = make(map[string]string, 1)
	}
	env[deviceEnvName(d.Name)] = d.UUID
	edits := specs.ContainerEdits{DeviceNodes: nodes, Mounts: bindMounts(d.Mounts)}
	withMemoryLimit(df, &edits, env, d)
	edits.Env = envList(env)
	return specs.Device{Name: cdiDeviceName(claimUID, d.Name), ContainerEdits: edits}, nil
}

func bindMounts(mounts []Mount) []*specs.Mount {
	var out []*specs.Mount
	for _, m := range mounts {
		out = append(out, &specs.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: []string{"rw", "nosuid", "nodev", "bind"}})
	}
	return out
}

// envList renders env sorted, so the same claim always yields the same file.
func envList(env map[string]string) []string {
	if len(env) == 0 {
		return nil
	}
	list := make([]string, 0, len(env))
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	return list
}

// validate runs the CDI library's own checks on a spec before it is written,
// so a bad spec is reported at prepare time instead of failing the container
// runtime later (the library validates only when reading files).
func validate(spec *specs.Spec) error {
	if err := specs.ValidateVersion(spec); err != nil {
		return err
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	if err := parser.ValidateClassName(class); err != nil {
		return err
	}
	if err := (&cdiapi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
		return err
	}
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return err
		}
		if err := (&cdiapi.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Validate(); err != nil {
			return fmt.Errorf("device %q: %w", d.Name, err)
		}
	}
	return nil
}
