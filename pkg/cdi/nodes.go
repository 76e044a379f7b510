package cdi

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// controlNode is a device node every CUDA container needs besides its GPUs.
type controlNode struct {
	path string
	// required: without it no GPU works in the container.
	required bool
	// why the node may be missing, for the log line when it is.
	why string
}

// controlNodes are added to every spec when the host has them. nvcdi lists
// only those that are character devices when the handler starts; these are
// checked at each write, since the driver creates some of them on first use.
//
// /dev/nvidia-uvm is required: nvcdi leaves a missing one out with a
// warning in its own log, and every CUDA program in the container then
// fails at cuInit with no word of why. A host creates it only once
// something loads nvidia-uvm there; a container cannot. So a claim fails
// at prepare naming the fix, and succeeds on the kubelet's retry once the
// node exists (it is checked at each write).
var controlNodes = []controlNode{
	{path: "/dev/nvidiactl", required: true},
	{path: "/dev/nvidia-uvm", required: true,
		why: "CUDA needs it; create it on the host with nvidia-modprobe -u -c=0 (or nvidia-ctk system create-device-nodes --control-devices)"},
	{path: "/dev/nvidia-uvm-tools", why: "only profilers and debuggers use it"},
}

// capsFileMode is the mode the driver gives MIG capability nodes
// (DeviceFileMode 0444 in /proc/driver/nvidia/capabilities/.../access):
// opening them for reading is what grants access to a MIG device.
const capsFileMode = os.FileMode(0o444)

// nodeChecker decides which device nodes a spec names and how.
//
// A node named by path only is stat'ed by the container runtime on the host
// when it creates the container, and a missing one fails the container. So
// such a node is named only if it exists, which is checked where this
// process sees the dev root (localRoot: the chart mounts the host's at
// /host), while the spec names the host's path (hostRoot).
//
// MIG capability nodes are the exception: they exist on the host only once
// a process there opened them, which a MIG device created at prepare never
// had. They are written as full character devices (type, major, minor,
// mode), which the runtime creates in the container without the host node.
type nodeChecker struct {
	// hostRoot is the dev root the host's runtime sees; the spec's paths.
	hostRoot string
	// localRoot is the dev root as this process sees it; empty when no
	// driver root is configured at all (unit tests of other packages),
	// where nodes are named unchecked.
	localRoot string
	// strict is set when the driver is installed under the driver root:
	// then a required node that is missing is an error, since a GPU
	// container without it cannot work. Without a driver (simulated GPUs)
	// the nodes that exist are named and the rest left out.
	strict bool
	// procDevices is where the nvidia-caps major is read.
	procDevices string
}

func newNodeChecker(opts Options, driverInstalled bool) nodeChecker {
	return nodeChecker{
		hostRoot:    hostDevRootOf(opts),
		localRoot:   devRootOf(opts),
		strict:      driverInstalled,
		procDevices: cmp.Or(opts.ProcDevicesPath, mig.ProcDevicesPath),
	}
}

// exists reports whether the dev root holds path. Lstat, as the runtime
// does: a symlink there is not a device node to the runtime either.
func (c nodeChecker) exists(path string) (bool, error) {
	if c.localRoot == "" {
		return true, nil
	}
	_, err := os.Lstat(filepath.Join(c.localRoot, path))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("checking device node %s: %w", path, err)
}

// node returns the spec entry of a node named by path, or nil when the host
// lacks it and it may be left out.
func (c nodeChecker) node(log klog.Logger, path string, required bool, why string) (*specs.DeviceNode, error) {
	ok, err := c.exists(path)
	if err != nil {
		return nil, err
	}
	if ok {
		return newDeviceNode(c.hostRoot, path), nil
	}
	if required && c.strict {
		return nil, fmt.Errorf("device node %s does not exist under %s: %s", path, c.localRoot,
			cmp.Or(why, "is the NVIDIA kernel module loaded, and is the driver root right?"))
	}
	log.V(1).Info("Device node missing on the host, left out of the CDI spec", "node", path, "devRoot", c.localRoot, "why", cmp.Or(why, "no NVIDIA driver under the driver root"))
	return nil, nil
}

// controlNodes returns the control nodes the spec adds to those of the
// common edits (have).
func (c nodeChecker) controlNodes(log klog.Logger, have []*specs.DeviceNode) ([]*specs.DeviceNode, error) {
	listed := make(map[string]bool, len(have))
	for _, n := range have {
		listed[n.Path] = true
	}
	var out []*specs.DeviceNode
	for _, cn := range controlNodes {
		if listed[cn.path] {
			continue
		}
		n, err := c.node(log, cn.path, cn.required, cn.why)
		if err != nil {
			return nil, err
		}
		if n != nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// gpuNode is the /dev/nvidiaN of a device: required, a MIG device's too
// (its parent's).
func (c nodeChecker) gpuNode(log klog.Logger, minor int) (*specs.DeviceNode, error) {
	return c.node(log, "/dev/nvidia"+strconv.Itoa(minor), true, "")
}

// capsMajor reads the nvidia-caps major when some device has capability
// nodes. It is read at each such write: a driver reload may change it.
func (c nodeChecker) capsMajor(devices []Device) (uint32, error) {
	for _, d := range devices {
		if len(d.ExtraNodes) > 0 {
			major, err := mig.CapsMajor(c.procDevices)
			if err != nil {
				return 0, fmt.Errorf("MIG capability nodes: %w", err)
			}
			return major, nil
		}
	}
	return 0, nil
}

// migWithoutCaps checks a MIG device that comes without capability nodes:
// the plugin found no entry for it because the driver's mig-minors file
// does not exist. Without its access nodes no process in the container
// can open the MIG device, so CUDA there sees no GPU. Where the kernel
// has the NVIDIA capability driver (nvidia-caps in /proc/devices) that
// file must exist, and the claim fails saying so; without it (simulated
// GPUs, no NVIDIA kernel module) there is nothing to add, and the log
// says what the container will lack.
func (c nodeChecker) migWithoutCaps(log klog.Logger, d Device) error {
	if !strings.HasPrefix(d.UUID, "MIG-") || len(d.ExtraNodes) > 0 {
		return nil
	}
	if _, err := mig.CapsMajor(c.procDevices); err == nil && c.strict {
		return fmt.Errorf("MIG device %s has no capability nodes (%s/nvidia-capN): the kernel has the NVIDIA capability driver (%s lists nvidia-caps), "+
			"but the driver's MIG minors file %s was not found; without them CUDA in the container cannot open the MIG device",
			d.UUID, mig.CapsDeviceDir, c.procDevices, mig.MigMinorsPath)
	}
	if c.strict {
		log.Error(nil, "MIG device without capability nodes: CUDA in the container will not see it",
			"device", d.Name, "uuid", d.UUID, "why", "no NVIDIA capability driver (nvidia-caps) in "+c.procDevices)
		return nil
	}
	log.V(1).Info("MIG device without capability nodes", "device", d.Name, "uuid", d.UUID, "why", "no NVIDIA driver under the driver root")
	return nil
}

// capNode is a MIG capability node as a full character device. Its
// HostPath names the host's path like every other node's, but the runtime
// needs no node there: with type and major given, a failed stat is no error.
func (c nodeChecker) capNode(major uint32, n mig.CapNode) *specs.DeviceNode {
	node := newDeviceNode(c.hostRoot, n.Path)
	mode := capsFileMode
	node.Type, node.Major, node.Minor, node.FileMode = "c", int64(major), int64(n.Minor), &mode
	return node
}

// newDeviceNode names a node by path; the runtime fills in type, major and
// minor from the host's node, HostPath when the host's dev root is not /.
func newDeviceNode(devRoot, path string) *specs.DeviceNode {
	node := &specs.DeviceNode{Path: path}
	if devRoot != "" && devRoot != "/" {
		node.HostPath = filepath.Join(devRoot, path)
	}
	return node
}
