package framework

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// NVIDIA's character-device majors: 195 for the GPUs and nvidiactl, as the
// driver registers them; nvidia-uvm's major is dynamic on a real host, any
// free one will do here.
const (
	nvidiaMajor = 195
	uvmMajor    = 509
)

// MakeDriverRoot creates a simulated NVIDIA driver root under dir: the
// device nodes a driver installs (/dev/nvidia0..gpus-1, nvidiactl,
// nvidia-uvm, nvidia-uvm-tools) made with mknod, plus /usr/bin and the
// library directory the driver's files live in. The container runtime
// stats every device node a CDI spec names, so the nodes must be real
// character devices; they are made here, never in the machine's /dev.
func MakeDriverRoot(dir string, gpus int) error {
	for _, sub := range []string{"dev", "usr/bin", "usr/lib/x86_64-linux-gnu"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("creating driver root: %w", err)
		}
	}
	nodes := map[string]uint64{
		"nvidiactl":        unix.Mkdev(nvidiaMajor, 255),
		"nvidia-uvm":       unix.Mkdev(uvmMajor, 0),
		"nvidia-uvm-tools": unix.Mkdev(uvmMajor, 1),
	}
	for i := 0; i < gpus; i++ {
		nodes[fmt.Sprintf("nvidia%d", i)] = unix.Mkdev(nvidiaMajor, uint32(i))
	}
	for name, dev := range nodes {
		path := filepath.Join(dir, "dev", name)
		if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(dev)); err != nil && !os.IsExist(err) {
			return fmt.Errorf("mknod %s: %w", path, err)
		}
	}
	return nil
}
