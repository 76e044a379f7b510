package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage"
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

// DriverUserspaceDir is where hack/build-driver-userspace.sh (make
// driver-userspace) unpacks NVIDIA's real driver userspace from Debian's
// packages, laid out as a host install: libraries flat in
// usr/lib/x86_64-linux-gnu with the links ldconfig makes, binaries in
// usr/bin, and the libc they need.
const DriverUserspaceDir = "_output/driver-userspace/host"

// InstallDriverUserspace copies NVIDIA's real driver userspace into a
// driver root made by MakeDriverRoot, and the directories a root has that
// the MPS daemon pods mount into (tmp, dev/shm). Copied, not linked: the
// real node's directory is a mount of its own.
func InstallDriverUserspace(ctx context.Context, driverRoot string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	src := filepath.Join(root, DriverUserspaceDir)
	if _, err := os.Stat(filepath.Join(src, "usr", "bin", "nvidia-smi")); err != nil {
		return fmt.Errorf("NVIDIA's driver userspace is not built (make driver-userspace): %w", err)
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", src+"/.", driverRoot+"/").CombinedOutput(); err != nil {
		return fmt.Errorf("copying the driver userspace into %s: %w: %s", driverRoot, err, out)
	}
	for dir, mode := range map[string]os.FileMode{"tmp": 0o1777, "dev/shm": 0o1777} {
		if err := os.MkdirAll(filepath.Join(driverRoot, dir), mode); err != nil {
			return fmt.Errorf("creating %s in the driver root: %w", dir, err)
		}
	}
	// The MPS control daemon, run inside the root, opens /dev/null.
	null := filepath.Join(driverRoot, "dev", "null")
	if err := unix.Mknod(null, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil && !os.IsExist(err) {
		return fmt.Errorf("mknod %s: %w", null, err)
	}
	return nil
}

// DriverUserspaceVersion is the driver version of the real userspace.
func DriverUserspaceVersion() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(root, filepath.Dir(DriverUserspaceDir), "VERSION"))
	if err != nil {
		return "", fmt.Errorf("driver userspace version (make driver-userspace): %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// realToolSuffix keeps a driver tool that a stand-in replaced, so a test
// can put the real one back (UseRealNVTool).
const realToolSuffix = ".driver"

// UseRealNVTool puts the driver's own tool back in place of its stand-in
// (real=true) or the stand-in back (real=false), in usr/bin of the driver
// root: the plugin and nvcdi look tools up there at each call.
func UseRealNVTool(driverRoot, name string, real bool) error {
	bin := filepath.Join(driverRoot, "usr", "bin")
	stash, bring := name+".stand-in", name+realToolSuffix
	if !real {
		stash, bring = bring, stash
	}
	if err := os.Rename(filepath.Join(bin, name), filepath.Join(bin, stash)); err != nil {
		return fmt.Errorf("setting %s aside: %w", name, err)
	}
	if err := os.Rename(filepath.Join(bin, bring), filepath.Join(bin, name)); err != nil {
		return fmt.Errorf("putting %s in place: %w", name, err)
	}
	return nil
}

// ToolCall is one call of the stand-in NVIDIA tools (hack/fakenvtools), a
// line of their call log.
type ToolCall struct {
	Tool  string            `json:"tool"`
	Args  []string          `json:"args"`
	Env   map[string]string `json:"env"`
	Stdin string            `json:"stdin"`
}

// String is how a call appears in test failures.
func (c ToolCall) String() string {
	return strings.TrimSpace(c.Tool + " " + strings.Join(c.Args, " ") + " " + strings.ReplaceAll(c.Stdin, "\n", " "))
}

// FakeNVTools are the tools hack/fakenvtools stands in for.
var FakeNVTools = []string{"nvidia-smi", "nvidia-cuda-mps-control"}

// InstallFakeNVTools builds hack/fakenvtools into the driver root's
// usr/bin as the named tools (FakeNVTools when none), the tools the plugin
// runs for time-slice intervals and MPS, recording their calls in callLog
// (which must be writable where the plugin runs them). A real tool there
// is kept aside for UseRealNVTool.
func InstallFakeNVTools(ctx context.Context, driverRoot, callLog string, tools ...string) error {
	if len(tools) == 0 {
		tools = FakeNVTools
	}
	bin := filepath.Join(driverRoot, "usr", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for _, name := range tools {
		real := filepath.Join(bin, name)
		if _, err := os.Stat(real); err == nil {
			if err := os.Rename(real, real+realToolSuffix); err != nil {
				return fmt.Errorf("keeping the driver's %s: %w", name, err)
			}
		}
	}
	built, err := buildFakeNVTools(ctx, filepath.Join(bin, tools[0]))
	if err != nil {
		return err
	}
	for _, name := range tools {
		dst := filepath.Join(bin, name)
		if dst == built {
			continue
		}
		if err := copyExecutable(built, dst); err != nil {
			return fmt.Errorf("installing the stand-in %s: %w", name, err)
		}
	}
	cfg, err := json.Marshal(map[string]string{"callLog": callLog})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bin, "fake-nvtools.json"), cfg, 0o644)
}

// fakeNVTools is the stand-in tools' binary built by this process, copied
// into each driver root after the first: a link cannot cross the real
// node's directory, which is a mount of its own.
var fakeNVTools struct {
	sync.Mutex
	path string
}

// buildFakeNVTools builds hack/fakenvtools at out, unless this process
// built it before and that file is still there; it returns the binary.
func buildFakeNVTools(ctx context.Context, out string) (string, error) {
	fakeNVTools.Lock()
	defer fakeNVTools.Unlock()
	if fakeNVTools.path != "" {
		if _, err := os.Stat(fakeNVTools.path); err == nil {
			return fakeNVTools.path, nil
		}
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	if err := ociimage.StaticBinary(ctx, root, "hack/fakenvtools", out, false); err != nil {
		return "", fmt.Errorf("building the stand-in NVIDIA tools: %w", err)
	}
	fakeNVTools.path = out
	return out, nil
}

// copyExecutable copies an executable file, replacing dst.
func copyExecutable(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// ReadToolCalls reads a call log of the stand-in tools; a missing log is
// no call.
func ReadToolCalls(callLog string) ([]ToolCall, error) {
	data, err := os.ReadFile(callLog)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var calls []ToolCall
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var c ToolCall
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			return nil, fmt.Errorf("call log %s: %w", callLog, err)
		}
		calls = append(calls, c)
	}
	return calls, nil
}
