package main

import (
	"errors"
	"flag"
	"fmt"
	"math"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// useFlags are the flags of use and proc: the device, what it does.
type useFlags struct {
	gpu, mig *string
	sm, mem  *uint
	memUsed  *string
}

func addUseFlags(fs *flag.FlagSet) *useFlags {
	return &useFlags{
		gpu:     fs.String("gpu", "", "the GPU, by index or UUID"),
		mig:     fs.String("mig", "", "the MIG device, by UUID (instead of --gpu)"),
		sm:      fs.Uint("sm", 0, "SM utilization (a MIG device: SM activity), percent"),
		mem:     fs.Uint("mem", 0, "memory utilization, percent (not for a MIG device)"),
		memUsed: fs.String("mem-used", "0", "memory used: a size (1Gi, 512Mi) or bytes"),
	}
}

// device is the GPU or MIG device the flags name.
func (f *useFlags) device(name string) (string, error) {
	switch {
	case *f.gpu != "" && *f.mig != "":
		return "", fmt.Errorf("%s takes --gpu or --mig, not both\n%s", name, usage)
	case *f.gpu == "" && *f.mig == "":
		return "", fmt.Errorf("%s needs --gpu or --mig\n%s", name, usage)
	case *f.mig != "":
		return *f.mig, nil
	}
	return *f.gpu, nil
}

// values are the percents and the size the flags give.
func (f *useFlags) values() (sm, mem uint32, used uint64, err error) {
	for _, p := range []*uint{f.sm, f.mem} {
		if *p > 100 {
			return 0, 0, 0, fmt.Errorf("a utilization is a percent, 0 to 100, not %d", *p)
		}
	}
	q, err := resource.ParseQuantity(*f.memUsed)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("--mem-used %q is not a size (1Gi, 512Mi, bytes): %w", *f.memUsed, err)
	}
	if q.Sign() < 0 {
		return 0, 0, 0, fmt.Errorf("--mem-used %q is negative", *f.memUsed)
	}
	return uint32(*f.sm), uint32(*f.mem), uint64(q.Value()), nil
}

func use(args []string) error {
	c := newCommand("use", false)
	f := addUseFlags(c.fs)
	if err := c.parse(args); err != nil {
		return err
	}
	device, err := f.device("use")
	if err != nil {
		return err
	}
	sm, mem, used, err := f.values()
	if err != nil {
		return err
	}
	if *f.mig == "" {
		return nvmock.SetGPUUse(*c.stateDir, device, nvmock.GPUUse{SMUtil: sm, MemUtil: mem, MemoryUsed: used})
	}
	if mem != 0 {
		return errors.New("use --mig takes no --mem: NVML measures no memory utilization of a MIG device")
	}
	return nvmock.SetMIGUse(*c.stateDir, device, nvmock.MIGUse{SMActivity: sm, MemoryUsed: used})
}

func useUnsupported(args []string) error {
	c := newCommand("use-unsupported", true)
	off := c.fs.Bool("off", false, "the GPU's use calls answer again")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetUseSupported(*c.stateDir, *c.gpu, *off)
}

func proc(args []string) error {
	c := newCommand("proc", false)
	f := addUseFlags(c.fs)
	pid := c.fs.Uint("pid", 0, "the process ID NVML lists")
	name := c.fs.String("name", "", "the process's name (SystemGetProcessName)")
	end := c.fs.Bool("end", false, "the process ends: NVML lists it no more, on any device")
	if err := c.parse(args); err != nil {
		return err
	}
	if *pid == 0 || *pid > math.MaxUint32 {
		return fmt.Errorf("proc needs --pid, a process ID\n%s", usage)
	}
	if *end {
		return nvmock.EndProcess(*c.stateDir, uint32(*pid))
	}
	device, err := f.device("proc")
	if err != nil {
		return err
	}
	sm, mem, used, err := f.values()
	if err != nil {
		return err
	}
	return nvmock.SetProcessUse(*c.stateDir, device, nvmock.ProcessUse{PID: uint32(*pid), Name: *name, SMUtil: sm, MemUtil: mem, MemoryUsed: used})
}
