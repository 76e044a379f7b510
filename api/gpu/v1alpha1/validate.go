package v1alpha1

import (
	"fmt"
	"slices"
)

// supportedStrategies lists the sharing strategies this version implements.
// A strategy not in the list is refused by name rather than ignored.
var supportedStrategies = []SharingStrategy{ExclusiveStrategy}

// Validate checks a sharing block.
func (s *Sharing) Validate() error {
	if s == nil {
		return nil
	}
	if s.Strategy == "" {
		return fmt.Errorf("sharing.strategy: required, one of %v", supportedStrategies)
	}
	if !slices.Contains(supportedStrategies, s.Strategy) {
		return fmt.Errorf("sharing.strategy: unsupported value %q, must be one of %v", s.Strategy, supportedStrategies)
	}
	return nil
}

// effectiveStrategy turns an absent sharing block into the default.
func effectiveStrategy(s *Sharing) SharingStrategy {
	if s == nil || s.Strategy == "" {
		return ExclusiveStrategy
	}
	return s.Strategy
}

// Validate checks a GpuConfig.
func (c *GpuConfig) Validate() error {
	if err := c.Sharing.Validate(); err != nil {
		return fmt.Errorf("%s: %w", GpuConfigKind, err)
	}
	return nil
}

// SharingStrategy returns the effective strategy.
func (c *GpuConfig) SharingStrategy() SharingStrategy { return effectiveStrategy(c.Sharing) }

// Validate checks a MigConfig.
func (c *MigConfig) Validate() error {
	if err := c.Sharing.Validate(); err != nil {
		return fmt.Errorf("%s: %w", MigConfigKind, err)
	}
	return nil
}

// SharingStrategy returns the effective strategy.
func (c *MigConfig) SharingStrategy() SharingStrategy { return effectiveStrategy(c.Sharing) }
