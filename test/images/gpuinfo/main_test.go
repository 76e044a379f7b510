package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestEnvLines(t *testing.T) {
	environ := []string{
		"PATH=/bin",
		"NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a",
		"CUDA_VERSION=12.4",
		"HOME=/",
		"GPUAAS_CLAIM=c1",
		"MY_NVIDIA_THING=x", // prefix must be at the start of the name
		"NVIDIA_DRIVER_CAPABILITIES=compute,utility",
		"NIC_ETH0=pci0000:37",
	}
	want := []string{
		"env CUDA_VERSION=12.4",
		"env GPUAAS_CLAIM=c1",
		"env NIC_ETH0=pci0000:37",
		"env NVIDIA_DRIVER_CAPABILITIES=compute,utility",
		"env NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a",
	}
	if got := envLines(environ); !slices.Equal(got, want) {
		t.Errorf("envLines = %q, want %q", got, want)
	}
}

const sampleMountinfo = `1101 1000 0:150 / / rw,relatime master:300 - overlay overlay rw,lowerdir=/a,upperdir=/b,workdir=/c
1102 1101 0:152 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1103 1101 0:153 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
1104 1103 0:154 / /dev/pts rw,nosuid,noexec,relatime - devpts devpts rw,gid=5,mode=620,ptmxmode=666
1105 1103 0:149 / /dev/mqueue rw,nosuid,nodev,noexec,relatime - mqueue mqueue rw
1106 1101 0:155 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
1107 1106 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw
1108 1101 259:2 /var/lib/kubelet/pods/u/etc-hosts /etc/hosts rw,relatime - ext4 /dev/nvme0n1p2 rw
1109 1103 259:2 /var/lib/kubelet/pods/u/containers/c/0 /dev/termination-log rw,relatime - ext4 /dev/nvme0n1p2 rw
1110 1101 259:2 /var/lib/containerd/sandboxes/s/hostname /etc/hostname rw,relatime - ext4 /dev/nvme0n1p2 rw
1111 1101 259:2 /var/lib/containerd/sandboxes/s/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/nvme0n1p2 rw
1112 1103 0:148 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k
1113 1101 0:40 / /var/run/secrets/kubernetes.io/serviceaccount ro,relatime - tmpfs tmpfs rw
1114 1101 259:2 /var/lib/gpuaas/claims/x /var/lib/gpuaas/claims/x rw,nosuid,nodev,relatime - ext4 /dev/nvme0n1p2 rw
1115 1101 259:2 /opt/my\040dir /opt/my\040dir rw,relatime - ext4 /dev/nvme0n1p2 rw
1116 1101 259:2 /opt/lib /opt/lib rw,relatime - ext4 /dev/nvme0n1p2 rw
1117 1101 259:2 /opt/lib /opt/lib rw,relatime - ext4 /dev/nvme0n1p2 rw
1118 1102 0:156 / /proc/driver/nvidia rw,relatime - tmpfs tmpfs rw
1119 1101 259:2 /x /procfs-not-proc rw,relatime - ext4 /dev/nvme0n1p2 rw
`

func TestMountLines(t *testing.T) {
	got, err := mountLines(sampleMountinfo)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"mount /opt/lib", // stacked twice, reported once
		"mount /opt/my dir",
		"mount /procfs-not-proc", // only /proc and below are usual
		"mount /var/lib/gpuaas/claims/x",
		"shm / dev=0:148 fs=tmpfs",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mountLines = %q, want %q", got, want)
	}
}

// TestMountLinesSharedShm: an MPS client's /dev/shm, bound over the
// container's own from the daemon's directory, is reported by its source.
func TestMountLinesSharedShm(t *testing.T) {
	shared := sampleMountinfo + "1120 1103 259:2 /var/lib/p/mps/GPU-1/shm /dev/shm rw,nosuid,nodev,relatime - ext4 /dev/nvme0n1p2 rw\n"
	got, err := mountLines(shared)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, "shm /var/lib/p/mps/GPU-1/shm dev=259:2 fs=ext4") {
		t.Errorf("mountLines = %q, want the shared /dev/shm", got)
	}
}

func TestMountLinesMalformed(t *testing.T) {
	for _, text := range []string{"1 2 3 4\n", `1 2 0:1 / /a\04 rw - x x rw` + "\n", `1 2 0:1 / /a\9xx rw - x x rw` + "\n"} {
		if _, err := mountLines(text); err == nil {
			t.Errorf("mountLines(%q): want an error", text)
		}
	}
}

func TestSplitDev(t *testing.T) {
	// makedev(195, 255) and a large one, makedev(511, 1048575).
	for _, tc := range []struct{ dev, major, minor uint64 }{
		{195<<8 | 255, 195, 255},
		{(511&0xfff)<<8 | (1048575&0xff | (1048575&^0xff)<<12), 511, 1048575},
	} {
		if major, minor := splitDev(tc.dev); major != tc.major || minor != tc.minor {
			t.Errorf("splitDev(%#x) = %d:%d, want %d:%d", tc.dev, major, minor, tc.major, tc.minor)
		}
	}
}

// TestDeviceLines checks that regular files named like devices are skipped
// and, where the test may create device nodes (as root), that real nodes in
// subdirectories are reported with their numbers.
func TestDeviceLines(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "dev")
	mustMkdir(t, filepath.Join(dev, "nvidia-caps"))
	mustWrite(t, filepath.Join(dev, "nvidia0"))
	mustWrite(t, filepath.Join(dev, "nvidia-caps", "nvidia-cap1"))
	mustWrite(t, filepath.Join(dev, "null"))

	var want []string
	if mknod(t, filepath.Join(dev, "nvidia1"), syscall.S_IFCHR, 195, 1) {
		mknod(t, filepath.Join(dev, "nvidia-caps", "nvidia-cap2"), syscall.S_IFCHR, 236, 2)
		mknod(t, filepath.Join(dev, "nvidiactl-blk"), syscall.S_IFBLK, 7, 300)
		mknod(t, filepath.Join(dev, "zero"), syscall.S_IFCHR, 1, 5)
		want = []string{
			"dev /dev/nvidia-caps/nvidia-cap2 c 236:2",
			"dev /dev/nvidia1 c 195:1",
			"dev /dev/nvidiactl-blk b 7:300",
		}
	}
	got, err := deviceLines(dev)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("deviceLines = %q, want %q", got, want)
	}
}

func TestReport(t *testing.T) {
	root := t.TempDir()
	mustMkdir(t, filepath.Join(root, "dev"))
	mustMkdir(t, filepath.Join(root, "proc", "self"))
	if err := os.WriteFile(filepath.Join(root, "proc", "self", "mountinfo"), []byte(sampleMountinfo), 0o644); err != nil {
		t.Fatal(err)
	}
	probe := []string{"cuda libcuda.so.1 cuInit=100"}
	got, err := report(root, []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "PATH=/bin"}, probe)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"env NVIDIA_VISIBLE_DEVICES=GPU-a",
		"mount /opt/lib",
		"mount /opt/my dir",
		"mount /procfs-not-proc",
		"mount /var/lib/gpuaas/claims/x",
		"shm / dev=0:148 fs=tmpfs",
		"shm writable=false", // the test root has no dev/shm
		"cuda libcuda.so.1 cuInit=100",
		doneLine,
	}
	if !slices.Equal(got, want) {
		t.Errorf("report = %q, want %q", got, want)
	}
	if _, err := report(t.TempDir(), nil, nil); err == nil {
		t.Error("report on an empty root: want an error")
	}
}

// mknod creates a device node and reports whether it could; without the
// privilege to do so the caller leaves device nodes out of the test.
func mknod(t *testing.T, path string, kind uint32, major, minor uint64) bool {
	t.Helper()
	dev := int((major&0xfff)<<8 | (major&^0xfff)<<32 | minor&0xff | (minor&^0xff)<<12)
	err := syscall.Mknod(path, kind|0o600, dev)
	if errors.Is(err, syscall.EPERM) {
		t.Logf("cannot create device nodes, testing regular files only: %v", err)
		return false
	}
	if err != nil {
		t.Fatalf("mknod %s: %v", path, err)
	}
	return true
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("not a device"), 0o644); err != nil {
		t.Fatal(err)
	}
}
