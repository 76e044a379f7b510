package mig_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig/migtest"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// Product names of the mocked GPUs, as NVIDIA's MIG user guide names them.
const (
	a100_40 = "A100-SXM4-40GB"
	a100_80 = "A100-SXM4-80GB"
	h100_80 = "H100-SXM5-80GB"
)

var products = []string{a100_40, a100_80, h100_80}

// machine returns a completed 8-GPU mock of the product: go-nvml's dgxa100
// and dgxh100, and an 8 x A100-SXM4-80GB server for the one go-nvml ships
// no machine for.
func machine(t testing.TB, product string) *server.Server {
	t.Helper()
	var s *server.Server
	switch product {
	case a100_40:
		s = dgxa100.New()
	case h100_80:
		s = dgxh100.New()
	case a100_80:
		var err error
		s, err = server.New(server.WithGPUs(gpus.Multiple(8, gpus.A100_SXM4_80GB)...))
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown product %q", product)
	}
	migtest.CompleteMock(s)
	return s
}

func gpu(s *server.Server, i int) *server.Device { return s.Devices[i].(*server.Device) }

// migOn sets MIG mode as an admin would; Ampere cannot do it from the driver.
func migOn(t testing.TB, d *server.Device) {
	t.Helper()
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
}

func profiles(t testing.TB, d nvml.Device) []mig.Profile {
	t.Helper()
	ps, err := mig.Profiles(d)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func profileNamed(t testing.TB, ps []mig.Profile, name string) mig.Profile {
	t.Helper()
	p, ok := mig.ProfileByName(ps, name)
	if !ok {
		t.Fatalf("no profile %s", name)
	}
	return p
}

// parentOf builds the parent of a mock GPU with as many attributes as the
// plugin publishes for a whole GPU, so size checks and benchmarks are real.
func parentOf(t testing.TB, d *server.Device) mig.Parent {
	t.Helper()
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	ver := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &s} }
	return mig.Parent{
		Index: d.Index,
		UUID:  d.UUID,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":                            str("gpu"),
			"uuid":                            str(d.UUID),
			"productName":                     str(d.Config.Name),
			"brand":                           str("Nvidia"),
			"architecture":                    str("Hopper"),
			"cudaComputeCapability":           ver("9.0.0"),
			"driverVersion":                   ver("550.54.15"),
			"cudaDriverVersion":               ver("12.4.0"),
			"index":                           {IntValue: ptr.To(int64(d.Index))},
			"minor":                           {IntValue: ptr.To(int64(d.Minor))},
			"migCapable":                      {BoolValue: ptr.To(true)},
			"resource.kubernetes.io/pciBusID": str(d.PciBusID),
			"resource.kubernetes.io/pcieRoot": str("pci0000:17"),
			"resource.kubernetes.io/numaNode": {IntValue: ptr.To(int64(0))},
		},
	}
}

func layout(t testing.TB, d *server.Device) mig.Layout {
	t.Helper()
	l, err := mig.BuildDynamic(parentOf(t, d), profiles(t, d), true)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// fits is the scheduler's rule for KEP-4815: devices can be allocated
// together when, for every counter of the set, what they consume adds up
// to at most what the set has. A consumed counter the set lacks never fits.
func fits(set resourceapi.CounterSet, devices ...resourceapi.Device) bool {
	return len(overCommitted(set, devices...)) == 0
}

// overCommitted lists the counters that the devices together exceed.
func overCommitted(set resourceapi.CounterSet, devices ...resourceapi.Device) []string {
	used := map[string]int64{}
	for _, d := range devices {
		for _, c := range d.ConsumesCounters {
			if c.CounterSet != set.Name {
				continue
			}
			for name, v := range c.Counters {
				used[name] += v.Value.Value()
			}
		}
	}
	var over []string
	for name, n := range used {
		have, ok := set.Counters[name]
		if !ok || n > have.Value.Value() {
			over = append(over, name)
		}
	}
	return over
}
