package mig

import (
	"strconv"
	"strings"
)

// DeviceName is the stable name of a MIG device: its GPU's NVML index, the
// profile and the first memory slice of its placement, for example
// "gpu-0-mig-1g10gb-6" or "gpu-0-mig-1g10gbme-3". Only what the hardware
// fixes goes in, so a name survives plugin restarts and MIG mode changes,
// and a static instance at a placement has the dynamic device's name.
// Index, profile and placement are bounded, so the name is far below the
// 63 characters a DNS label allows.
func DeviceName(gpuIndex int, p Profile, pl Placement) string {
	var b strings.Builder
	b.Grow(24)
	b.WriteString("gpu-")
	b.WriteString(strconv.Itoa(gpuIndex))
	b.WriteString("-mig-")
	writeProfileLabel(&b, p.Name)
	b.WriteByte('-')
	b.WriteString(strconv.Itoa(pl.Start))
	return b.String()
}

// StaticDeviceName names an instance that already exists. Compute variants
// add the compute instance ID: several of them share one GPU instance, and
// so one placement.
func StaticDeviceName(gpuIndex int, p Profile, inst Instance) string {
	name := DeviceName(gpuIndex, p, inst.Placement)
	if p.ComputeVariant {
		name += "-ci" + strconv.Itoa(inst.CIID)
	}
	return name
}

// CounterSetName is the name of a GPU's counter set.
func CounterSetName(gpuIndex int) string {
	return "gpu-" + strconv.Itoa(gpuIndex) + "-counters"
}

// writeProfileLabel turns NVIDIA's profile name into DNS-label characters:
// dots and commas go, "+attr" becomes "attr" and "-attr" becomes "noattr",
// so "1g.10gb+me" and "1g.10gb-me" stay distinct ("1g10gbme", "1g10gbnome").
func writeProfileLabel(b *strings.Builder, profile string) {
	for i := range len(profile) {
		c := profile[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			b.WriteByte(c)
		case c >= 'A' && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		case c == '-':
			b.WriteString("no")
		}
	}
}
