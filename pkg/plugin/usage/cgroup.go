package usage

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// PodOfCgroup is the UID of the Kubernetes pod whose cgroup a process's
// /proc/<pid>/cgroup names, and false for a process outside every pod. It
// reads the kubelet's layouts under both cgroup drivers and both cgroup
// versions, also nested below another hierarchy (a node in a container):
//
//	cgroupfs: .../kubepods/burstable/pod<uid>/<container>
//	          .../kubepods/pod<uid>/<container> (guaranteed)
//	systemd:  .../kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
//
// v1 lists one line per controller, v2 one line "0::<path>"; every line of
// a pod's process names the same pod, so the first that names one wins.
func PodOfCgroup(content []byte) (types.UID, bool) {
	sc := bufio.NewScanner(bytes.NewReader(content))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; the path may hold colons.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if uid, ok := podOfPath(parts[2]); ok {
			return uid, true
		}
	}
	return "", false
}

// podOfPath finds the pod segment below a kubepods segment of a cgroup path.
func podOfPath(path string) (types.UID, bool) {
	inKubepods := false
	for _, seg := range strings.Split(path, "/") {
		if seg == "kubepods" || strings.HasPrefix(seg, "kubepods.") || strings.HasPrefix(seg, "kubepods-") {
			inKubepods = true
		}
		if !inKubepods {
			continue
		}
		if uid, ok := podOfSegment(seg); ok {
			return uid, true
		}
	}
	return "", false
}

// podOfSegment reads "pod<uid>" (cgroupfs) or "kubepods[-<qos>]-pod<uid>.slice"
// (systemd, the UID's dashes written as underscores).
func podOfSegment(seg string) (types.UID, bool) {
	var raw string
	switch {
	case strings.HasSuffix(seg, ".slice"):
		_, after, found := strings.Cut(strings.TrimSuffix(seg, ".slice"), "-pod")
		if !found {
			return "", false
		}
		raw = strings.ReplaceAll(after, "_", "-")
	case strings.HasPrefix(seg, "pod"):
		raw = strings.TrimPrefix(seg, "pod")
	default:
		return "", false
	}
	if !isUID(raw) {
		return "", false
	}
	return types.UID(raw), true
}

// isUID accepts the 8-4-4-4-12 hexadecimal form the API server gives UIDs.
func isUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
	}
	return true
}

// procPods maps the PIDs NVML reports to pods through <root>/<pid>/cgroup,
// remembering each answer until the PID is no longer seen on a GPU (a PID
// reused by another process first leaves NVML's lists: it has exited).
type procPods struct {
	root string
	// known are the pods of PIDs seen in the current and the previous pass;
	// "" for a PID outside every pod or whose cgroup could not be read.
	known, seen map[uint32]types.UID
}

func newProcPods(root string) *procPods {
	return &procPods{root: root, known: map[uint32]types.UID{}, seen: map[uint32]types.UID{}}
}

// pod is the pod of pid; "" for none (a host process, or one that exited).
func (p *procPods) pod(pid uint32) types.UID {
	if uid, ok := p.seen[pid]; ok {
		return uid
	}
	uid, ok := p.known[pid]
	if !ok {
		content, err := os.ReadFile(filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10), "cgroup"))
		if err == nil {
			uid, _ = PodOfCgroup(content)
		}
	}
	p.seen[pid] = uid
	return uid
}

// endPass forgets the PIDs not seen since the last endPass.
func (p *procPods) endPass() {
	p.known, p.seen = p.seen, p.known
	clear(p.seen)
}
