package v1alpha1

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
)

const (
	// TimeSlicingStrategy: the processes on a GPU take turns, with the
	// GPU's time-slice interval. Nothing is partitioned or limited.
	TimeSlicingStrategy SharingStrategy = "TimeSlicing"
	// MPSStrategy: the processes on a GPU run through one MPS control
	// daemon per GPU, each claim with a pinned device memory limit and an
	// active thread percentage.
	MPSStrategy SharingStrategy = "MPS"
)

// TimeSliceInterval is the GPU's compute time-slice length.
type TimeSliceInterval string

const (
	DefaultTimeSlice TimeSliceInterval = "Default"
	ShortTimeSlice   TimeSliceInterval = "Short"
	MediumTimeSlice  TimeSliceInterval = "Medium"
	LongTimeSlice    TimeSliceInterval = "Long"
)

// TimeSliceIntervals lists the valid intervals in nvidia-smi's order
// (Default = 0 ... Long = 3).
var TimeSliceIntervals = []TimeSliceInterval{DefaultTimeSlice, ShortTimeSlice, MediumTimeSlice, LongTimeSlice}

// Validate accepts the empty interval (meaning Default) and the named ones.
func (i TimeSliceInterval) Validate() error {
	if i == "" || slices.Contains(TimeSliceIntervals, i) {
		return nil
	}
	return fmt.Errorf("interval: unsupported value %q, must be one of %v", i, TimeSliceIntervals)
}

// OrDefault turns the empty interval into Default.
func (i TimeSliceInterval) OrDefault() TimeSliceInterval {
	if i == "" {
		return DefaultTimeSlice
	}
	return i
}

// TimeSlicingConfig holds the settings of the TimeSlicing strategy.
type TimeSlicingConfig struct {
	// Interval overrides the GPU's interval from the node configuration.
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// MpsConfig holds the settings of the MPS strategy. Unset limits are
// derived from the device: a replica's or share's memory, and its share of
// the GPU's threads.
type MpsConfig struct {
	// DefaultActiveThreadPercentage caps the SMs a client may use, 1..100.
	DefaultActiveThreadPercentage *int `json:"defaultActiveThreadPercentage,omitempty"`
	// DefaultPinnedDeviceMemoryLimit caps the device memory a client may
	// allocate; at most the memory of the allocated device.
	DefaultPinnedDeviceMemoryLimit *resource.Quantity `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
}

// WithinCaps refuses limits of c above those caps sets, naming the cap
// and where it comes from (source: the class's config, the device's
// share): a tenant's config can only lower what it was sold. Limits
// either leaves unset are not compared.
func (c *MpsConfig) WithinCaps(caps *MpsConfig, source string) error {
	if c == nil || caps == nil {
		return nil
	}
	if p, hi := c.DefaultActiveThreadPercentage, caps.DefaultActiveThreadPercentage; p != nil && hi != nil && *p > *hi {
		return fmt.Errorf("mpsConfig.defaultActiveThreadPercentage %d is above the cap of %d (%s)", *p, *hi, source)
	}
	if q, hi := c.DefaultPinnedDeviceMemoryLimit, caps.DefaultPinnedDeviceMemoryLimit; q != nil && hi != nil && q.Cmp(*hi) > 0 {
		return fmt.Errorf("mpsConfig.defaultPinnedDeviceMemoryLimit %s is above the cap of %s (%s)", q, hi, source)
	}
	return nil
}

// MPSConfigOf is the MPS settings of a decoded configuration; nil for none.
func MPSConfigOf(cfg Interface) *MpsConfig {
	var sh *Sharing
	switch c := cfg.(type) {
	case *GpuConfig:
		sh = c.Sharing
	case *MigConfig:
		sh = c.Sharing
	}
	if sh == nil {
		return nil
	}
	return sh.MpsConfig
}

func (c *MpsConfig) validate() error {
	if c == nil {
		return nil
	}
	if p := c.DefaultActiveThreadPercentage; p != nil && (*p < 1 || *p > 100) {
		return fmt.Errorf("mpsConfig.defaultActiveThreadPercentage: %d is out of range 1..100", *p)
	}
	if q := c.DefaultPinnedDeviceMemoryLimit; q != nil && q.Sign() <= 0 {
		return fmt.Errorf("mpsConfig.defaultPinnedDeviceMemoryLimit: %s must be positive", q)
	}
	return nil
}
