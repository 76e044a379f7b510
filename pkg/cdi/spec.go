package cdi

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// buildSpec assembles the spec of one claim: the common edits plus one
// claim-wide NVIDIA_VISIBLE_DEVICES at spec level, and the device nodes and
// extra env of each device at device level.
func (h *Handler) buildSpec(claimUID string, devices []Device) (*specs.Spec, error) {
	if err := validateClaimUID(claimUID); err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("no devices")
	}
	spec := &specs.Spec{
		Kind:           Kind,
		Devices:        make([]specs.Device, 0, len(devices)),
		ContainerEdits: h.common,
	}
	// Env is the only part of the shared common edits we extend: clipping
	// makes append copy, so concurrent writes never share a backing array.
	spec.ContainerEdits.Env = append(slices.Clip(h.common.Env), visibleDevices(devices))
	seen := make(map[string]bool, len(devices))
	for _, d := range devices {
		if err := validateDevice(d); err != nil {
			return nil, err
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("duplicate device %q", d.Name)
		}
		seen[d.Name] = true
		spec.Devices = append(spec.Devices, h.deviceSpec(claimUID, d))
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
	for _, p := range append(slices.Clone(d.ExtraNodes), d.Mounts...) {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("device %q: extra node or mount %q is not an absolute path", d.Name, p)
		}
	}
	if _, ok := d.Env[visibleDevicesEnv]; ok {
		return fmt.Errorf("device %q: %s is set per claim, not per device", d.Name, visibleDevicesEnv)
	}
	return nil
}

// visibleDevices lists all UUIDs of the claim in one variable: CDI merges env
// of the devices of a container last-wins, so a per-device value would keep
// only one GPU.
func visibleDevices(devices []Device) string {
	uuids := make([]string, len(devices))
	for i, d := range devices {
		uuids[i] = d.UUID
	}
	return visibleDevicesEnv + "=" + strings.Join(uuids, ",")
}

func (h *Handler) deviceSpec(claimUID string, d Device) specs.Device {
	nodes := make([]*specs.DeviceNode, 0, 1+len(d.ExtraNodes))
	nodes = append(nodes, newDeviceNode(h.devRoot, "/dev/nvidia"+strconv.Itoa(d.Minor)))
	for _, p := range d.ExtraNodes {
		nodes = append(nodes, newDeviceNode(h.devRoot, p))
	}
	return specs.Device{
		Name: cdiDeviceName(claimUID, d.Name),
		ContainerEdits: specs.ContainerEdits{
			DeviceNodes: nodes,
			Env:         envList(d.Env),
			Mounts:      bindMounts(d.Mounts),
		},
	}
}

func bindMounts(dirs []string) []*specs.Mount {
	var out []*specs.Mount
	for _, dir := range dirs {
		out = append(out, &specs.Mount{HostPath: dir, ContainerPath: dir, Options: []string{"rw", "nosuid", "nodev", "bind"}})
	}
	return out
}

// deviceNode names a node by path only: the runtime fills in type, major and
// minor from the host node when it creates the container, so the spec stays
// valid on hosts (tests, demo) where the node does not exist yet.
func newDeviceNode(devRoot, path string) *specs.DeviceNode {
	node := &specs.DeviceNode{Path: path}
	if devRoot != "" && devRoot != "/" {
		node.HostPath = filepath.Join(devRoot, path)
	}
	return node
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
