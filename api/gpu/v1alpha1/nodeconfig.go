package v1alpha1

import (
	"errors"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"sigs.k8s.io/yaml"
)

// NodeConfigKind is the kind of the node configuration file.
const NodeConfigKind = "NodeConfig"

// MigStrategy says how a MIG-capable GPU is offered.
type MigStrategy string

const (
	// MigStatic offers the MIG instances that already exist (made by the
	// admin, e.g. with mig-parted); the parent GPU is not offered whole.
	MigStatic MigStrategy = "static"
	// MigDynamic offers every (profile, placement) as a partitionable device
	// and creates the instance when a claim is prepared.
	MigDynamic MigStrategy = "dynamic"
)

// GpuMode is how one GPU is offered. The zero value offers it whole.
type GpuMode struct {
	// MIG selects static or dynamic MIG; empty means no MIG.
	MIG MigStrategy `json:"mig,omitempty"`
	// MigModeEnabledByAdmin says the admin has already enabled MIG mode on
	// this GPU. Ampere GPUs need a reset to change MIG mode, so the plugin
	// never toggles it there and needs this promise for dynamic MIG.
	MigModeEnabledByAdmin bool `json:"migModeEnabledByAdmin,omitempty"`
	// MigProfiles, with mig: dynamic, are the MIG profiles offered (e.g.
	// [1g.10gb, 3g.40gb, 7g.80gb]); empty offers every profile of the GPU.
	// Each profile offered is one device per placement that the scheduler
	// examines for every pod on every node (29 per H100 with all of them),
	// so offering only the profiles the catalog sells makes scheduling
	// faster and slices smaller.
	MigProfiles []string `json:"migProfiles,omitempty"`
	// TimeSlicing offers the GPU as N time-slice replicas.
	TimeSlicing *TimeSlicingMode `json:"timeSlicing,omitempty"`
	// Shared offers the GPU as one multi-allocatable device whose memory
	// claims consume.
	Shared *SharedMode `json:"shared,omitempty"`
}

// GpuModeSelector applies a mode to the GPUs it selects.
type GpuModeSelector struct {
	// Indexes selects GPUs by NVML index.
	Indexes []int `json:"indexes,omitempty"`
	// UUIDs selects GPUs by UUID.
	UUIDs   []string `json:"uuids,omitempty"`
	GpuMode `json:",inline"`
}

// NodeConfig is the plugin's node configuration file: how each GPU of the
// node is offered. It is set from Helm values through a ConfigMap.
type NodeConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Default applies to GPUs that no entry of GPUs selects.
	Default GpuMode `json:"default,omitempty"`
	// GPUs override Default; the first entry that selects a GPU wins.
	GPUs []GpuModeSelector `json:"gpus,omitempty"`
	// Health tunes the GPU health monitor; nil uses its defaults.
	Health *HealthConfig `json:"health,omitempty"`
	// GPUUnitCounters makes every device offered whole, as time-slice
	// replicas or as MIG consume its share of its GPU, in thousandths, from
	// a counter gpu-milliunits of its GPU's counter set (KEP-4815), which
	// is what Kueue's counter-based DRA quota charges. Shared GPUs never
	// do. Nil means true. False publishes no counters for whole GPUs,
	// replicas and static MIG, and dynamic MIG's counter sets lack it.
	GPUUnitCounters *bool `json:"gpuUnitCounters,omitempty"`
}

// UnitCounters reports whether devices consume GPU milliunits; on unless
// the file turns them off.
func (c *NodeConfig) UnitCounters() bool {
	return c == nil || c.GPUUnitCounters == nil || *c.GPUUnitCounters
}

// DeepCopyObject implements runtime.Object.
func (c *NodeConfig) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	out := *c
	out.Default = c.Default.deepCopy()
	out.Health = c.Health.deepCopy()
	if c.GPUUnitCounters != nil {
		units := *c.GPUUnitCounters
		out.GPUUnitCounters = &units
	}
	out.GPUs = make([]GpuModeSelector, len(c.GPUs))
	for i, s := range c.GPUs {
		s.Indexes = slices.Clone(s.Indexes)
		s.UUIDs = slices.Clone(s.UUIDs)
		s.GpuMode = s.deepCopy()
		out.GPUs[i] = s
	}
	return &out
}

// ModeFor returns the mode of a GPU.
func (c *NodeConfig) ModeFor(index int, uuid string) GpuMode {
	for _, s := range c.GPUs {
		if slices.Contains(s.Indexes, index) || slices.Contains(s.UUIDs, uuid) {
			return s.GpuMode
		}
	}
	return c.Default
}

// Validate checks the whole file and reports every problem at once.
func (c *NodeConfig) Validate() error {
	errs := []error{}
	if err := c.Default.validate(); err != nil {
		errs = append(errs, fmt.Errorf("default: %w", err))
	}
	for i, s := range c.GPUs {
		if len(s.Indexes) == 0 && len(s.UUIDs) == 0 {
			errs = append(errs, fmt.Errorf("gpus[%d]: selects no GPU: set indexes or uuids", i))
		}
		if slices.ContainsFunc(s.Indexes, func(i int) bool { return i < 0 }) {
			errs = append(errs, fmt.Errorf("gpus[%d].indexes: must not be negative", i))
		}
		if err := s.validate(); err != nil {
			errs = append(errs, fmt.Errorf("gpus[%d]: %w", i, err))
		}
	}
	if c.Health != nil {
		if err := c.Health.validate(); err != nil {
			errs = append(errs, fmt.Errorf("health: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (m GpuMode) validate() error {
	switch m.MIG {
	case "", MigStatic, MigDynamic:
	default:
		return fmt.Errorf("mig: unsupported value %q, must be %q or %q", m.MIG, MigStatic, MigDynamic)
	}
	if m.MigModeEnabledByAdmin && m.MIG == "" {
		return errors.New("migModeEnabledByAdmin: only meaningful with mig")
	}
	if err := m.validateMigProfiles(); err != nil {
		return err
	}
	return m.validateSharing()
}

func (m GpuMode) validateMigProfiles() error {
	if len(m.MigProfiles) == 0 {
		return nil
	}
	if m.MIG != MigDynamic {
		return fmt.Errorf("migProfiles: only meaningful with mig: %s", MigDynamic)
	}
	seen := map[string]bool{}
	for _, name := range m.MigProfiles {
		if name == "" || seen[name] {
			return fmt.Errorf("migProfiles: %q is empty or listed twice", name)
		}
		seen[name] = true
	}
	return nil
}

var nodeConfigScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	s.AddKnownTypes(SchemeGroupVersion, &NodeConfig{})
	return s
}()

var nodeConfigDecoder = json.NewSerializerWithOptions(json.DefaultMetaFactory, nodeConfigScheme, nodeConfigScheme,
	json.SerializerOptions{Strict: true})

// DecodeNodeConfig strictly decodes and validates a node configuration file
// (YAML or JSON). Empty input is the default configuration: every GPU whole.
func DecodeNodeConfig(data []byte) (*NodeConfig, error) {
	if len(data) == 0 {
		return &NodeConfig{}, nil
	}
	raw, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parsing node configuration: %w", err)
	}
	obj, _, err := nodeConfigDecoder.Decode(raw, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding node configuration: %w", err)
	}
	cfg, ok := obj.(*NodeConfig)
	if !ok {
		return nil, fmt.Errorf("decoding node configuration: want kind %s, got %T", NodeConfigKind, obj)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid node configuration: %w", err)
	}
	return cfg, nil
}
