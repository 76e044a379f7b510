// Command gpuinfo is the workload of the node e2e tests.
//
// A test pod runs it with a GPU claim; it prints to stdout what the container
// actually received through CDI (environment, NVIDIA device nodes, extra
// mounts), so a test can compare the container's view against the claim by
// reading the pod log, with no exec and no GPU tools in the image. Then it
// sleeps until SIGTERM so the pod stays Running while the test inspects it.
//
// It also probes the driver the way a CUDA program would (unless -cuda=false):
// it loads libcuda.so.1 and libnvidia-ml.so.1 by soname, reports where they
// came from and what cuInit and nvmlInit_v2 return, and runs nvidia-smi if
// it is in PATH. Without a GPU or kernel module those fail with the driver's
// own codes (CUDA_ERROR_NO_DEVICE=100, NVML_ERROR_DRIVER_NOT_LOADED=9); a
// dlopen error instead means the libraries were not injected right. This
// needs a cgo build; a static one reports that it could not probe.
//
// The report is one fact per line, sorted within each kind of fact, ending
// with "gpuinfo done":
//
//	env GPUAAS_DEVICE_GPU_0=GPU-1234
//	env NVIDIA_VISIBLE_DEVICES=void
//	dev /dev/nvidia0 c 195:0
//	mount /var/lib/gpuaas
//	shm / dev=0:148 fs=tmpfs
//	shm writable=true
//	cuda libcuda.so.1 cuInit=100
//	cuda libcuda.so.1 path=/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03
//	cuda libnvidia-ml.so.1 dlopen-error=libnvidia-ml.so.1: cannot open shared object file: No such file or directory
//	nvidia-smi exit=9 NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. ...
//	gpuinfo done
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// doneLine ends the report, so a reader knows it saw all of it.
const doneLine = "gpuinfo done"

// envPrefixes select the variables CDI specs and the driver set. NIC_ is
// what the NIC driver double (test/nicdriver) sets, so that a shape's test
// sees another driver's device next to our GPUs.
var envPrefixes = []string{"NVIDIA_", "CUDA_", "GPUAAS_", "NIC_"}

// usualMounts are mount points every container has; only the rest can have
// come from a CDI spec.
var usualMounts = map[string]bool{
	"/":                    true,
	"/dev":                 true,
	"/dev/pts":             true,
	"/dev/mqueue":          true,
	"/dev/shm":             true,
	"/dev/termination-log": true,
	"/etc/hosts":           true,
	"/etc/hostname":        true,
	"/etc/resolv.conf":     true,
}

// usualMountTrees are skipped together with everything below them.
var usualMountTrees = []string{"/proc", "/sys", "/var/run/secrets", "/run/secrets"}

func main() {
	once := flag.Bool("once", false, "print the report and exit instead of sleeping until SIGTERM")
	root := flag.String("root", "/", "directory holding the dev and proc trees to inspect (for tests)")
	cuda := flag.Bool("cuda", true, "probe the driver libraries and nvidia-smi")
	flag.Parse()

	// Register before reporting: a SIGTERM that arrives right after the
	// report must still end the program with status 0.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	var probe []string
	if *cuda {
		probe = cudaLines()
	}
	lines, err := report(*root, os.Environ(), probe)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuinfo: %v\n", err)
		os.Exit(1)
	}
	// One write, so the report is not interleaved with anything else.
	if _, err := io.WriteString(os.Stdout, strings.Join(lines, "\n")+"\n"); err != nil {
		fmt.Fprintf(os.Stderr, "gpuinfo: write report: %v\n", err)
		os.Exit(1)
	}
	if *once {
		return
	}
	<-signals
}

// report returns all lines of the report: the container's view below root
// and in environ, then the probe's lines, the done line last.
func report(root string, environ []string, probe []string) ([]string, error) {
	devs, err := deviceLines(filepath.Join(root, "dev"))
	if err != nil {
		return nil, err
	}
	mountinfo, err := os.ReadFile(filepath.Join(root, "proc", "self", "mountinfo"))
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	mounts, err := mountLines(string(mountinfo))
	if err != nil {
		return nil, err
	}
	lines := envLines(environ)
	lines = append(lines, devs...)
	lines = append(lines, mounts...)
	lines = append(lines, shmWritable(root))
	lines = append(lines, probe...)
	return append(lines, doneLine), nil
}

// envLines reports the GPU-related variables of environ ("KEY=value"),
// sorted.
func envLines(environ []string) []string {
	var lines []string
	for _, kv := range environ {
		for _, p := range envPrefixes {
			if strings.HasPrefix(kv, p) {
				lines = append(lines, "env "+kv)
				break
			}
		}
	}
	sort.Strings(lines)
	return lines
}

// deviceLines reports every character or block device below devDir whose
// name starts with "nvidia", as "dev /dev/<path> <c|b> <major>:<minor>",
// sorted. Files that merely carry such a name are not devices and are
// skipped; so are subdirectories that cannot be read, since the container
// may not own all of /dev.
func deviceLines(devDir string) ([]string, error) {
	var lines []string
	err := filepath.WalkDir(devDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != devDir && errors.Is(err, fs.ErrPermission) {
				return fs.SkipDir
			}
			return err
		}
		if d.IsDir() || !strings.HasPrefix(d.Name(), "nvidia") {
			return nil
		}
		line, ok, err := deviceLine(devDir, p)
		if ok {
			lines = append(lines, line)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", devDir, err)
	}
	sort.Strings(lines)
	return lines, nil
}

// deviceLine describes the node at p, or reports ok=false if it is not a
// device node.
func deviceLine(devDir, p string) (line string, ok bool, err error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return "", false, fmt.Errorf("stat %s: %w", p, err)
	}
	var kind string
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFCHR:
		kind = "c"
	case syscall.S_IFBLK:
		kind = "b"
	default:
		return "", false, nil
	}
	rel, err := filepath.Rel(devDir, p)
	if err != nil {
		return "", false, fmt.Errorf("device %s: %w", p, err)
	}
	major, minor := splitDev(st.Rdev)
	name := path.Join("/dev", filepath.ToSlash(rel))
	return fmt.Sprintf("dev %s %s %d:%d", name, kind, major, minor), true, nil
}

// splitDev decodes Linux's dev_t (glibc's gnu_dev_major/minor layout), done
// here so the workload needs no module beyond the standard library.
func splitDev(dev uint64) (major, minor uint64) {
	major = (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor = dev&0xff | (dev>>12)&^0xff
	return major, minor
}

// mountLines reports the unusual mount points of a /proc/self/mountinfo
// text as "mount <path>", sorted and without duplicates (stacked mounts).
func mountLines(mountinfo string) ([]string, error) {
	seen := map[string]bool{}
	var lines []string
	var shm string
	sc := bufio.NewScanner(strings.NewReader(mountinfo))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		// Fields: ID, parent ID, major:minor, root, mount point, ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			return nil, fmt.Errorf("mountinfo line %q: too few fields", sc.Text())
		}
		mp, err := unescapeMountPoint(fields[4])
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %q: %w", sc.Text(), err)
		}
		if mp == "/dev/shm" {
			// The last of stacked mounts is the one the container sees.
			shm = fmt.Sprintf("shm %s dev=%s fs=%s", fields[3], fields[2], fsType(fields))
		}
		if usualMount(mp) || seen[mp] {
			continue
		}
		seen[mp] = true
		lines = append(lines, "mount "+mp)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	// /dev/shm by where it comes from (its root in its file system) and
	// which file system it is: an MPS client's is its GPU's, a tmpfs the
	// daemon shares, not the container's own.
	if shm != "" {
		lines = append(lines, shm)
	}
	sort.Strings(lines)
	return lines, nil
}

// fsType is the file system type of a mountinfo line: the field after
// the " - " separator that ends the optional fields.
func fsType(fields []string) string {
	for i, f := range fields {
		if f == "-" && i+1 < len(fields) {
			return fields[i+1]
		}
	}
	return "unknown"
}

// shmWritable reports whether this process (whatever user it runs as) can
// create a file in /dev/shm, as an MPS client must.
func shmWritable(root string) string {
	f, err := os.CreateTemp(filepath.Join(root, "dev", "shm"), "gpuinfo-")
	if err != nil {
		return "shm writable=false"
	}
	_ = f.Close()
	_ = os.Remove(f.Name())
	return "shm writable=true"
}

func usualMount(mp string) bool {
	if usualMounts[mp] {
		return true
	}
	for _, t := range usualMountTrees {
		if mp == t || strings.HasPrefix(mp, t+"/") {
			return true
		}
	}
	return false
}

// unescapeMountPoint undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) in mountinfo paths.
func unescapeMountPoint(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("truncated escape in %q", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape in %q: %w", s, err)
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}
