package mig_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// cpuTime is the CPU (user + system) this process has used: the budget in
// DESIGN.md is CPU, and the garbage collector's share counts.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func h100Node(b *testing.B) (*server.Server, []mig.Parent) {
	s := machine(b, h100_80)
	parents := make([]mig.Parent, len(s.Devices))
	for i := range s.Devices {
		parents[i] = parentOf(b, gpu(s, i))
	}
	return s, parents
}

// BenchmarkBuildDynamicMIGNode is publishing an 8 x H100 node in dynamic
// mode, from NVML to API objects: every GPU's profiles and placements read
// through NVML (the mock), its counter set, and all its MIG devices with
// attributes, capacities and counter consumption. Budget: 100 ms of CPU.
func BenchmarkBuildDynamicMIGNode(b *testing.B) {
	s, parents := h100Node(b)
	devices, n := 0, 0
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		devices = 0
		for i, parent := range parents {
			ps, err := mig.Profiles(s.Devices[i])
			if err != nil {
				b.Fatal(err)
			}
			l, err := mig.BuildDynamic(parent, ps, true)
			if err != nil {
				b.Fatal(err)
			}
			devices += len(l.Partitions) + 1 // and the whole GPU
		}
		n++
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Millisecond)/float64(n), "cpu-ms/op")
	b.ReportMetric(float64(devices), "devices")
}

// BenchmarkBuildDynamicMIGLayouts is the same without the NVML reads, for
// a plugin that keeps each GPU's profiles from startup.
func BenchmarkBuildDynamicMIGLayouts(b *testing.B) {
	s, parents := h100Node(b)
	ps := make([][]mig.Profile, len(parents))
	for i := range parents {
		ps[i] = profiles(b, s.Devices[i])
	}
	n := 0
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		for i, parent := range parents {
			if _, err := mig.BuildDynamic(parent, ps[i], true); err != nil {
				b.Fatal(err)
			}
		}
		n++
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Millisecond)/float64(n), "cpu-ms/op")
}

// BenchmarkCreateDestroy is the MIG part of preparing and unpreparing one
// dynamic MIG device on the mock: GPU and compute instance created, MIG
// device UUID found, both destroyed.
func BenchmarkCreateDestroy(b *testing.B) {
	s := machine(b, h100_80)
	d := gpu(s, 0)
	if err := mig.EnableMigMode(d); err != nil {
		b.Fatal(err)
	}
	p := profileNamed(b, profiles(b, d), "1g.10gb")
	b.ReportAllocs()
	for b.Loop() {
		inst, err := mig.Create(d, p, p.Placements[6])
		if err != nil {
			b.Fatal(err)
		}
		if err := mig.Destroy(d, inst); err != nil {
			b.Fatal(err)
		}
	}
}
