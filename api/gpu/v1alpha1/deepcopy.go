package v1alpha1

import "k8s.io/apimachinery/pkg/runtime"

// Hand-written deep copies: the types are tiny and hold no maps or slices.

// DeepCopy returns a copy of s.
func (s *Sharing) DeepCopy() *Sharing {
	if s == nil {
		return nil
	}
	out := *s
	if s.TimeSlicingConfig != nil {
		ts := *s.TimeSlicingConfig
		out.TimeSlicingConfig = &ts
	}
	if s.MpsConfig != nil {
		out.MpsConfig = s.MpsConfig.DeepCopy()
	}
	return &out
}

// DeepCopy returns a copy of c.
func (c *MpsConfig) DeepCopy() *MpsConfig {
	if c == nil {
		return nil
	}
	out := MpsConfig{}
	if c.DefaultActiveThreadPercentage != nil {
		p := *c.DefaultActiveThreadPercentage
		out.DefaultActiveThreadPercentage = &p
	}
	if c.DefaultPinnedDeviceMemoryLimit != nil {
		q := c.DefaultPinnedDeviceMemoryLimit.DeepCopy()
		out.DefaultPinnedDeviceMemoryLimit = &q
	}
	return &out
}

// DeepCopyObject implements runtime.Object.
func (c *GpuConfig) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	return &GpuConfig{TypeMeta: c.TypeMeta, Sharing: c.Sharing.DeepCopy()}
}

// DeepCopyObject implements runtime.Object.
func (c *MigConfig) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	return &MigConfig{TypeMeta: c.TypeMeta, Sharing: c.Sharing.DeepCopy()}
}
