package v1alpha1

import "k8s.io/apimachinery/pkg/runtime"

// Hand-written deep copies: the types are tiny and hold no maps or slices.

// DeepCopy returns a copy of s.
func (s *Sharing) DeepCopy() *Sharing {
	if s == nil {
		return nil
	}
	out := *s
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
