// Command nvmlprobe reads a driver root's NVML the way the kubelet plugin
// does with --nvml real (pkg/nvdev's real backend, pkg/mig's MIG calls,
// NVML events as the health monitor registers them) and prints what it
// read as JSON. The simulated NVML's tests (hack/nvmlshim) run it on a
// driver root holding that library: the library must be dlopened by a
// process that defines no NVML symbols of its own, which the test binary
// of the library's package does.
//
//	nvmlprobe --driver-root DIR inventory
//	nvmlprobe --driver-root DIR describe --gpu N
//	nvmlprobe --driver-root DIR mig-create --gpu N --profile P [--hold]
//	nvmlprobe --driver-root DIR mig-list --gpu N
//	nvmlprobe --driver-root DIR mig-destroy --gpu N --gi G --ci C
//	nvmlprobe --driver-root DIR wait-event --gpu N --timeout D
//	nvmlprobe --driver-root DIR gc [--timeout D]
//	nvmlprobe --driver-root DIR use (--gpu N | --mig UUID) [--gpm-interval D]
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

func main() {
	fs := flag.NewFlagSet("nvmlprobe", flag.ExitOnError)
	root := fs.String("driver-root", "/", "driver root holding libnvidia-ml.so.1")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() < 1 {
		fail(errors.New("a command is needed"))
	}
	cmd, args := fs.Arg(0), fs.Args()[1:]
	sub := flag.NewFlagSet(cmd, flag.ExitOnError)
	gpu := sub.Int("gpu", 0, "GPU index")
	profile := sub.String("profile", "1g.10gb", "MIG profile")
	hold := sub.Bool("hold", false, "keep the session open after creating, until killed")
	gi := sub.Int("gi", 0, "GPU instance ID")
	ci := sub.Int("ci", 0, "compute instance ID")
	timeout := sub.Duration("timeout", 10*time.Second, "how long to wait")
	migUUID := sub.String("mig", "", "MIG device UUID (use: instead of --gpu)")
	gpmInterval := sub.Duration("gpm-interval", 200*time.Millisecond, "time between the two GPM samples (NVML wants over 100ms)")
	_ = sub.Parse(args)

	lib, err := nvdev.Open(nvdev.Options{Backend: nvdev.BackendReal, DriverRoot: *root})
	if err != nil {
		fail(err)
	}
	defer func() { _ = lib.Shutdown() }()
	var out any
	switch cmd {
	case "inventory":
		out = inventory(lib)
	case "describe":
		describe(inventory(lib), *gpu)
		return
	case "mig-create":
		out, err = migCreate(lib, *gpu, *profile)
		if err == nil && *hold {
			print(out)
			select {} // until SIGKILL: the instance must outlive the process
		}
	case "virtualization-mode":
		out, err = onGPU(lib, *gpu, func(d nvml.Device) (any, error) {
			mode, ret := d.GetVirtualizationMode()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("GetVirtualizationMode: %v", nvml.ErrorString(ret))
			}
			return int(mode), nil
		})
	case "mig-list":
		out, err = onGPU(lib, *gpu, func(d nvml.Device) (any, error) { return mig.List(d) })
	case "mig-destroy":
		out, err = onGPU(lib, *gpu, func(d nvml.Device) (any, error) {
			insts, err := mig.List(d)
			if err != nil {
				return nil, err
			}
			at := slices.IndexFunc(insts, func(in mig.Instance) bool { return in.GIID == *gi && in.CIID == *ci })
			if at < 0 {
				return nil, fmt.Errorf("no MIG device gi %d ci %d", *gi, *ci)
			}
			return insts[at], mig.Destroy(d, insts[at])
		})
	case "gc":
		gcWithSpinner(*timeout)
		return
	case "wait-event":
		out, err = waitEvent(lib, *gpu, *timeout)
	case "use":
		out, err = readUse(lib, *gpu, *migUUID, *gpmInterval)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fail(err)
	}
	print(out)
}

func print(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(data))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "nvmlprobe:", err)
	os.Exit(1)
}

// Inventory is what the plugin publishes from: nvdev's reading, and each
// MIG-capable GPU's profiles as pkg/mig names them.
type Inventory struct {
	System   nvdev.SystemInfo    `json:"system"`
	GPUs     []nvdev.GPU         `json:"gpus"`
	Problems []string            `json:"problems,omitempty"`
	Profiles map[string][]string `json:"profiles,omitempty"`
}

func inventory(lib nvdev.Interface) Inventory {
	inv := Inventory{System: lib.System(), GPUs: lib.GPUs(), Profiles: map[string][]string{}}
	for _, p := range lib.Problems() {
		inv.Problems = append(inv.Problems, p.String())
	}
	for _, g := range inv.GPUs {
		if !g.MigCapable {
			continue
		}
		dev, err := lib.DeviceByUUID(g.UUID)
		if err != nil {
			continue
		}
		ps, err := mig.Profiles(dev)
		if err != nil {
			inv.Profiles[g.UUID] = []string{"error: " + err.Error()}
			continue
		}
		for _, p := range ps {
			inv.Profiles[g.UUID] = append(inv.Profiles[g.UUID], fmt.Sprintf("%s@%v", p.Name, p.Placements))
		}
	}
	return inv
}

// describe prints one GPU of an inventory a field a line, for diff: what
// a machine of the same model answers alike (not its UUID or bus ID).
func describe(inv Inventory, index int) {
	fmt.Printf("driverVersion %s\ncudaDriverVersion %s\n", inv.System.DriverVersion, inv.System.CUDADriverVersion)
	at := slices.IndexFunc(inv.GPUs, func(g nvdev.GPU) bool { return g.Index == index })
	if at < 0 {
		fail(fmt.Errorf("no GPU %d", index))
	}
	g := inv.GPUs[at]
	fmt.Printf("productName %s\nbrand %s\narchitecture %s\ncudaComputeCapability %s\nmemoryBytes %d\n",
		g.ProductName, g.Brand, g.Architecture, g.CUDAComputeCapability, g.MemoryBytes)
	fmt.Printf("multiprocessors %d\nnumaNode %d\nmigCapable %t\nmigEnabled %t\nminor %d\n",
		g.Multiprocessors, g.NUMANode, g.MigCapable, g.MigEnabled, g.Minor)
	for _, p := range inv.Profiles[g.UUID] {
		fmt.Println("migProfile", p)
	}
	for _, p := range inv.Problems {
		fmt.Println("problem", p)
	}
}

func onGPU(lib nvdev.Interface, index int, f func(nvml.Device) (any, error)) (any, error) {
	gpus := lib.GPUs()
	at := slices.IndexFunc(gpus, func(g nvdev.GPU) bool { return g.Index == index })
	if at < 0 {
		return nil, fmt.Errorf("no GPU %d", index)
	}
	dev, err := lib.DeviceByUUID(gpus[at].UUID)
	if err != nil {
		return nil, err
	}
	return f(dev)
}

// migCreate makes a MIG device as a dynamic-MIG prepare does: MIG mode on
// if it is off, then the profile at its first free placement.
func migCreate(lib nvdev.Interface, index int, name string) (any, error) {
	return onGPU(lib, index, func(dev nvml.Device) (any, error) {
		if mode, _, ret := dev.GetMigMode(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting MIG mode: %w", ret)
		} else if mode != nvml.DEVICE_MIG_ENABLE {
			if err := mig.EnableMigMode(dev); err != nil {
				return nil, err
			}
		}
		profiles, err := mig.Profiles(dev)
		if err != nil {
			return nil, err
		}
		p, ok := mig.ProfileByName(profiles, name)
		if !ok {
			return nil, fmt.Errorf("no MIG profile %q", name)
		}
		var errs []error
		for _, pl := range p.Placements {
			inst, err := mig.Create(dev, p, pl)
			if err == nil {
				return inst, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	})
}

// Event is an NVML event as the probe read it.
type Event struct {
	UUID      string `json:"uuid"`
	EventType uint64 `json:"eventType"`
	Data      uint64 `json:"data"`
	GI        uint32 `json:"gi"`
	CI        uint32 `json:"ci"`
}

// waitEvent registers GPU index for XID and ECC events as the health
// monitor does, says so on stdout, and waits for one.
func waitEvent(lib nvdev.Interface, index int, timeout time.Duration) (any, error) {
	set, ret := lib.NVML().EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("creating event set: %w", ret)
	}
	defer func() { _ = set.Free() }()
	_, err := onGPU(lib, index, func(dev nvml.Device) (any, error) {
		supported, ret := dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting event types: %w", ret)
		}
		want := supported & (nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
		return nil, nvdev.Returned(dev.RegisterEvents(want, set))
	})
	if err != nil {
		return nil, err
	}
	fmt.Println(`"registered"`)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		data, ret := set.Wait(500)
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("waiting for events: %w", ret)
		}
		uuid, ret := data.Device.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting the event's GPU: %w", ret)
		}
		return Event{UUID: uuid, EventType: data.EventType, Data: data.EventData,
			GI: data.GpuInstanceId, CI: data.ComputeInstanceId}, nil
	}
	return nil, fmt.Errorf("no event in %s", timeout)
}

// gcWithSpinner collects garbage while a goroutine spins in a loop
// without calls: only an asynchronous preemption (SIGURG) stops it, so
// the collection finishes only if this runtime's SIGURGs reach its own
// handler. It runs with NVML open: the library's runtime is up.
func gcWithSpinner(timeout time.Duration) {
	var stop atomic.Bool
	var n uint64
	go func() {
		for !stop.Load() {
			n++
		}
	}()
	time.Sleep(50 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		runtime.GC()
		close(done)
	}()
	select {
	case <-done:
		stop.Store(true)
		print("gc finished")
		os.Exit(0)
	case <-time.After(timeout):
		fmt.Fprintln(os.Stderr, "nvmlprobe: garbage collection did not finish: the spinning goroutine was never preempted")
		os.Exit(3)
	}
}
