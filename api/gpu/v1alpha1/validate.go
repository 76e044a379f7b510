package v1alpha1

import (
	"fmt"
	"slices"
)

// supportedStrategies lists the sharing strategies this version implements.
// A strategy not in the list is refused by name rather than ignored.
var supportedStrategies = []SharingStrategy{ExclusiveStrategy, TimeSlicingStrategy, MPSStrategy}

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
	return s.validateSettings()
}

// validateSettings refuses settings of a strategy other than the chosen
// one: they would be silently ignored.
func (s *Sharing) validateSettings() error {
	if s.TimeSlicingConfig != nil && s.Strategy != TimeSlicingStrategy {
		return fmt.Errorf("sharing.timeSlicingConfig: only allowed with strategy %s, not %s", TimeSlicingStrategy, s.Strategy)
	}
	if s.MpsConfig != nil && s.Strategy != MPSStrategy {
		return fmt.Errorf("sharing.mpsConfig: only allowed with strategy %s, not %s", MPSStrategy, s.Strategy)
	}
	if s.TimeSlicingConfig != nil {
		if err := s.TimeSlicingConfig.Interval.Validate(); err != nil {
			return fmt.Errorf("sharing.timeSlicingConfig.%w", err)
		}
	}
	if err := s.MpsConfig.validate(); err != nil {
		return fmt.Errorf("sharing.%w", err)
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
