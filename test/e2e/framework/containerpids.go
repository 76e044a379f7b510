package framework

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// ContainerPIDs are the host PIDs of a container of the real node: the
// processes of its cgroup (the kubelet's cgroupfs layout, a directory named
// by the container's ID under its pod's, pod<UID>), as NVML would report
// them for a process of that container using a GPU. containerID is the
// runtime's ID, with or without the "containerd://" of a pod's status.
func (n *RealNode) ContainerPIDs(podUID types.UID, containerID string) ([]int, error) {
	_, id, found := strings.Cut(containerID, "://")
	if !found {
		id = containerID
	}
	pids := sets.New[int]()
	for _, root := range cgroupDirs(n.CgroupRoot) {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() != id || !podCgroup(filepath.Base(filepath.Dir(p)), podUID) {
				return nil
			}
			pids = pids.Union(procsUnder(p))
			return fs.SkipDir
		})
	}
	if pids.Len() == 0 {
		return nil, fmt.Errorf("no process of container %s of pod %s under cgroup %s", id, podUID, n.CgroupRoot)
	}
	out := sets.List(pids)
	slices.Sort(out)
	return out, nil
}

// podCgroup tells whether a cgroup directory is a pod's: pod<UID> with the
// cgroupfs driver, with the UID's dashes as underscores (and a .slice) with
// systemd's.
func podCgroup(dir string, uid types.UID) bool {
	return dir == "pod"+string(uid) || strings.HasSuffix(dir, "pod"+strings.ReplaceAll(string(uid), "-", "_")+".slice")
}

// procsUnder lists the processes of a cgroup directory and its children.
func procsUnder(dir string) sets.Set[int] {
	pids := sets.New[int]()
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
	return pids
}
