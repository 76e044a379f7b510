package v1alpha1

import (
	"errors"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HealthFaultKinds are the fault kinds whose taint effect a node may
// raise to NoExecute (see docs/health.md).
var HealthFaultKinds = []string{"xid", "ecc", "row-remap", "gpu-lost", "cleanup-blocked"}

// HealthConfig tunes the plugin's GPU health monitor.
type HealthConfig struct {
	// Disabled turns the monitor off: no taints, and the kubelet is told
	// that device health is not reported.
	Disabled bool `json:"disabled,omitempty"`
	// ProbeInterval is how often every GPU is asked whether it still
	// answers (default 5s).
	ProbeInterval *metav1.Duration `json:"probeInterval,omitempty"`
	// XIDQuietPeriod is how long a transient XID keeps its taint after it
	// was last seen (default 10m).
	XIDQuietPeriod *metav1.Duration `json:"xidQuietPeriod,omitempty"`
	// NoExecute lists fault kinds whose taints evict running pods that do
	// not tolerate them; the others only keep new claims away.
	NoExecute []string `json:"noExecute,omitempty"`
}

func (h *HealthConfig) validate() error {
	var errs []error
	for name, d := range map[string]*metav1.Duration{"probeInterval": h.ProbeInterval, "xidQuietPeriod": h.XIDQuietPeriod} {
		if d != nil && d.Duration <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %s", name, d.Duration))
		}
	}
	for _, k := range h.NoExecute {
		if !slices.Contains(HealthFaultKinds, k) {
			errs = append(errs, fmt.Errorf("noExecute: unknown fault kind %q, must be one of %v", k, HealthFaultKinds))
		}
	}
	return errors.Join(errs...)
}

func (h *HealthConfig) deepCopy() *HealthConfig {
	if h == nil {
		return nil
	}
	out := *h
	if h.ProbeInterval != nil {
		out.ProbeInterval = &metav1.Duration{Duration: h.ProbeInterval.Duration}
	}
	if h.XIDQuietPeriod != nil {
		out.XIDQuietPeriod = &metav1.Duration{Duration: h.XIDQuietPeriod.Duration}
	}
	out.NoExecute = slices.Clone(h.NoExecute)
	return &out
}
