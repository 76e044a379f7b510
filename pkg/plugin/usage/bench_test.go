package usage

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// benchNode is an 8-GPU node with 32 claims prepared: 2 GPUs whole, 2 GPUs
// of 3 MIG devices each (GPM), 2 time-sliced GPUs and 2 MPS GPUs of 6
// claims each, every shared claim with two processes (48 PIDs in a fake
// /proc). NVML is go-nvml's mock: the figure is the plugin's own work per
// pass (the calls' bookkeeping, cgroup reads, judging, metrics), not the
// driver's ioctls.
func benchNode(b *testing.B) (*Sampler, int) {
	b.Helper()
	root := b.TempDir()
	lib := &fakeNVML{devices: map[string]nvml.Device{}, lib: &mock.Interface{
		GpmSampleAllocFunc: func() (nvml.GpmSample, nvml.Return) {
			return &mock.GpmSample{FreeFunc: func() nvml.Return { return nvml.SUCCESS }}, nvml.SUCCESS
		},
		GpmMetricsGetFunc: func(g *nvml.GpmMetricsGetType) nvml.Return { g.Metrics[0].Value = 12; return nvml.SUCCESS },
	}}
	s := New(Options{NVML: lib, ProcRoot: root, Metrics: NewMetrics(prometheus.NewRegistry()), Thresholds: fixedThreshold(5)})
	t0 := time.Unix(0, 0)
	claims := 0
	track := func(gpuUUID string, d checkpoint.Device, pods ...types.UID) {
		uid := fmt.Sprintf("claim-%02d", claims)
		rec := record(uid, uid, gpuUUID, d)
		rec.Pods = nil
		for _, p := range pods {
			rec.Pods = append(rec.Pods, checkpoint.Pod{UID: string(p), Name: "pod-" + string(p)[:8]})
		}
		s.Track(rec, t0)
		claims++
	}
	for g := 0; g < 2; g++ {
		uuid := fmt.Sprintf("GPU-whole-%d", g)
		lib.devices[uuid] = gpu(40, 1<<30)
		track(uuid, checkpoint.Device{Device: fmt.Sprintf("gpu-%d", g), DeviceClass: "gpu"})
	}
	for g := 2; g < 4; g++ {
		uuid := fmt.Sprintf("GPU-mig-%d", g)
		lib.devices[uuid] = &mock.Device{
			GpmQueryDeviceSupportFunc: func() (nvml.GpmSupport, nvml.Return) { return nvml.GpmSupport{IsSupportedDevice: 1}, nvml.SUCCESS },
			GpmMigSampleGetFunc:       func(int, nvml.GpmSample) nvml.Return { return nvml.SUCCESS },
		}
		for i := 0; i < 3; i++ {
			mu := fmt.Sprintf("MIG-%d-%d", g, i)
			lib.devices[mu] = &mock.Device{GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Used: 1 << 28}, nvml.SUCCESS }}
			track(uuid, checkpoint.Device{Device: fmt.Sprintf("gpu-%d-mig-2g.20gb-%d", g, i), GPUMode: "dynamic", DeviceClass: "mig-2g",
				GPUShare: 2.0 / 7, CreatedMIG: &mig.Instance{UUID: mu, GIID: i + 1}})
		}
	}
	pid := uint32(1000)
	for g := 4; g < 8; g++ {
		uuid := fmt.Sprintf("GPU-shared-%d", g)
		var samples []nvml.ProcessUtilizationSample
		var procs []nvml.ProcessInfo
		pids := map[uint32]types.UID{}
		for i := 0; i < 6; i++ {
			pod := types.UID(fmt.Sprintf("%08d-0000-0000-0000-%012d", g, i))
			track(uuid, checkpoint.Device{Device: fmt.Sprintf("gpu-%d-ts-%d", g, i), GPUMode: "timeSlicing/6", GPUShare: 1.0 / 6, DeviceClass: "ts"}, pod)
			for p := 0; p < 2; p++ {
				pids[pid] = pod
				samples = append(samples, nvml.ProcessUtilizationSample{Pid: pid, SmUtil: uint32(i * 3)})
				procs = append(procs, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: 1 << 27})
				pid++
			}
		}
		fakeProc(b, root, pids)
		ts := uint64(0)
		lib.devices[uuid] = &mock.Device{
			GetProcessUtilizationFunc: func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
				ts++
				for i := range samples {
					samples[i].TimeStamp = ts
				}
				return samples, nvml.SUCCESS
			},
			GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS },
			GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
		}
	}
	return s, claims
}

// BenchmarkSamplePass is one sampling pass of an 8-GPU node with 32 claims
// prepared (BENCHMARKS.md, "Use sampling").
func BenchmarkSamplePass(b *testing.B) {
	s, claims := benchNode(b)
	if claims != 32 {
		b.Fatalf("%d claims, want 32", claims)
	}
	ctx := context.Background()
	now := time.Unix(0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(10 * time.Second)
		s.Sample(ctx, now)
	}
}
