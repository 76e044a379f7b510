// Command driverrelease shows, on a machine with a real NVIDIA GPU, what
// the plugin's maintenance (issue 25 item 4) sees: the driver version its
// watch reads under the driver root beside the one NVML reports, and the
// /dev/nvidia* files this process holds with an NVML session open, after
// releasing it (what --release-gpus does: none may be left, or rmmod and
// nvidia-smi -r stay blocked) and after reacquiring it. It touches only its
// own session: no reset, no unload. hack/compare-real-gpu.sh runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

func main() {
	driverRoot := flag.String("driver-root", "/", "root of the NVIDIA driver installation")
	flag.Parse()
	if err := run(*driverRoot); err != nil {
		fmt.Fprintln(os.Stderr, "driverrelease:", err)
		os.Exit(1)
	}
}

func run(driverRoot string) error {
	opts := nvdev.Options{Backend: nvdev.BackendReal, DriverRoot: driverRoot}
	lib, err := nvdev.Open(opts)
	if err != nil {
		return err
	}
	s := nvdev.NewReleasable(lib, opts)
	defer func() { _ = s.Shutdown() }()
	fmt.Printf("driver version: under %s %q (the watch), NVML %q\n", driverRoot, nvdev.InstalledDriverVersion(driverRoot), s.System().DriverVersion)
	fmt.Printf("session open:  holds %v\n", nvidiaFiles())
	if err := s.Release(); err != nil {
		return err
	}
	fmt.Printf("released:      holds %v (want none)\n", nvidiaFiles())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Reacquire(ctx, time.Second, func(err error) { fmt.Println("waiting:", err) }); err != nil {
		return err
	}
	fmt.Printf("reacquired:    holds %v, %d GPUs\n", nvidiaFiles(), len(s.GPUs()))
	return nil
}

// nvidiaFiles are the /dev/nvidia* files this process has open.
func nvidiaFiles() []string {
	fds, _ := filepath.Glob("/proc/self/fd/*")
	var out []string
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, "/dev/nvidia") {
			out = append(out, target)
		}
	}
	slices.Sort(out)
	return out
}
