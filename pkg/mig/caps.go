package mig

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

const (
	// MigMinorsPath is where the NVIDIA driver lists the minor numbers of
	// the MIG capability device nodes.
	MigMinorsPath = "/proc/driver/nvidia-caps/mig-minors"
	// CapsDeviceDir holds those nodes: nvidia-cap<minor>.
	CapsDeviceDir = "/dev/nvidia-caps"
	// ProcDevicesPath is where the kernel lists the majors of its drivers.
	ProcDevicesPath = "/proc/devices"
	// capsDriverName is the driver of the capability nodes in /proc/devices.
	// Its major is assigned when the module loads, so it is read, never
	// assumed.
	capsDriverName = "nvidia-caps"
)

// CapNode is one capability device node of a MIG device.
type CapNode struct {
	// Path is the node's path, /dev/nvidia-caps/nvidia-cap<Minor>.
	Path string
	// Minor is its minor number, as mig-minors lists it.
	Minor uint32
}

// CapDeviceNodes returns the capability device nodes a container needs to
// use one MIG device: its GPU instance's and its compute instance's access
// nodes, found in the driver's mig-minors file, whose lines read
// "gpu0/gi1/access 12" and "gpu0/gi1/ci0/access 13". gpuMinor is the
// parent GPU's minor number (the N of /dev/nvidiaN).
func CapDeviceNodes(migMinorsPath string, gpuMinor, giID, ciID int) ([]CapNode, error) {
	keys := []string{
		fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, giID),
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, giID, ciID),
	}
	minors, err := readMinors(migMinorsPath, keys)
	if err != nil {
		return nil, err
	}
	nodes := make([]CapNode, 0, len(keys))
	for _, k := range keys {
		m, ok := minors[k]
		if !ok {
			return nil, fmt.Errorf("%s has no entry %s", migMinorsPath, k)
		}
		nodes = append(nodes, CapNode{Path: CapsDeviceDir + "/nvidia-cap" + strconv.FormatUint(uint64(m), 10), Minor: m})
	}
	return nodes, nil
}

// readMinors returns the minors of the wanted entries of a mig-minors file.
func readMinors(path string, wanted []string) (map[string]uint32, error) {
	out := make(map[string]uint32, len(wanted))
	err := scanLines(path, func(line string) error {
		fields := strings.Fields(line)
		if len(fields) != 2 || !slices.Contains(wanted, fields[0]) {
			return nil
		}
		m, err := strconv.ParseUint(fields[1], 10, 32)
		if err != nil {
			return fmt.Errorf("%s: bad minor %q for %s", path, fields[1], fields[0])
		}
		out[fields[0]] = uint32(m)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("MIG minors: %w", err)
	}
	return out, nil
}

// CapsMajor returns the major number of the MIG capability nodes: the
// nvidia-caps entry among the character devices of procDevicesPath (the
// kernel's /proc/devices), whose lines read "237 nvidia-caps".
func CapsMajor(procDevicesPath string) (uint32, error) {
	major, found := uint32(0), false
	inChar := false
	err := scanLines(procDevicesPath, func(line string) error {
		switch line = strings.TrimSpace(line); {
		case strings.HasSuffix(line, "devices:"):
			// Block devices have majors of their own, under the same names.
			inChar = line == "Character devices:"
			return nil
		case !inChar || found:
			return nil
		}
		fields := strings.Fields(line)
		if len(fields) != 2 || fields[1] != capsDriverName {
			return nil
		}
		m, err := strconv.ParseUint(fields[0], 10, 32)
		if err != nil || m == 0 {
			return fmt.Errorf("%s: bad major %q for %s", procDevicesPath, fields[0], capsDriverName)
		}
		major, found = uint32(m), true
		return nil
	})
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%s lists no character device %s: is the NVIDIA driver loaded with MIG capability nodes (nvidia-caps)?", procDevicesPath, capsDriverName)
	}
	return major, nil
}

// scanLines calls fn for each line of the file at path.
func scanLines(path string, fn func(string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if err := fn(sc.Text()); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return nil
}
