package framework

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/sets"
)

// cgroupDirs are the directories of a cgroup path in every mounted
// hierarchy: one per controller on cgroup v1, one on v2.
func cgroupDirs(cgroup string) []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{filepath.Join("/sys/fs/cgroup", cgroup)}
	}
	matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cgroup))
	return matches
}

// makeCgroup creates a cgroup in every hierarchy: the kubelet refuses a
// cgroup root that does not exist. A new cpuset starts empty and admits no
// task, so it gets its parent's CPUs and memory nodes.
func makeCgroup(cgroup string) error {
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		hierarchies = []string{"/sys/fs/cgroup"}
	}
	for _, h := range hierarchies {
		if fi, err := os.Stat(h); err != nil || !fi.IsDir() {
			continue
		}
		dir := filepath.Join(h, cgroup)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if parent, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
					return fmt.Errorf("setting %s of %s: %w", f, dir, err)
				}
			}
		}
	}
	return nil
}

// cgroupPids lists the processes in a cgroup tree.
func cgroupPids(cgroup string) sets.Set[int] {
	pids := sets.New[int]()
	for _, dir := range cgroupDirs(cgroup) {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids.Insert(pid)
				}
			}
			return nil
		})
	}
	return pids
}

// killCgroup SIGKILLs every process in a cgroup tree until none is left:
// the containers a stopped kubelet leaves running.
func killCgroup(cgroup string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := cgroupPids(cgroup)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v in cgroup %s survive SIGKILL", sets.List(pids), cgroup)
		}
		for pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroup removes the cgroup tree, leaves first.
func removeCgroup(cgroup string) error {
	var errs []error
	for _, dir := range cgroupDirs(cgroup) {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// killShims ends the containerd shims serving the containerd at socket:
// they daemonize, so stopping containerd leaves them behind.
func killShims(socket string) error {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return fmt.Errorf("listing processes: %w", err)
	}
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(data, "\x00")), "\x00")
		if !strings.HasSuffix(args[0], "containerd-shim-runc-v2") || !slices.Contains(args, socket) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}

// makeSharedMount bind-mounts dir onto itself as a shared mount. On a real
// host / is shared (systemd makes it so), and the runtime refuses a
// mountPropagation of HostToContainer (the chart's driver-root mount) from
// a private mount; this machine's root is private.
func makeSharedMount(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s a shared mount: %w", dir, err)
	}
	return nil
}

// unmountUnder lazily unmounts every mount point below dir, deepest first:
// the kubelet bind-mounts its root dir onto itself and mounts volumes,
// containerd mounts rootfs snapshots and shm.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("reading mounts: %w", err)
	}
	defer func() { _ = f.Close() }()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMount(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount decodes the octal escapes (\040 for a space) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
