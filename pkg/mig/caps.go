package mig

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

const (
	// MigMinorsPath is where the NVIDIA driver lists the minor numbers of
	// the MIG capability device nodes.
	MigMinorsPath = "/proc/driver/nvidia-caps/mig-minors"
	// CapsDeviceDir holds those nodes: nvidia-cap<minor>.
	CapsDeviceDir = "/dev/nvidia-caps"
)

// CapDeviceNodes returns the capability device nodes a container needs to
// use one MIG device: its GPU instance's and its compute instance's access
// nodes, found in the driver's mig-minors file, whose lines read
// "gpu0/gi1/access 12" and "gpu0/gi1/ci0/access 13". gpuMinor is the
// parent GPU's minor number (the N of /dev/nvidiaN).
func CapDeviceNodes(migMinorsPath string, gpuMinor, giID, ciID int) ([]string, error) {
	f, err := os.Open(migMinorsPath)
	if err != nil {
		return nil, fmt.Errorf("opening MIG minors: %w", err)
	}
	defer func() { _ = f.Close() }()
	keys := [2]string{
		fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, giID),
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, giID, ciID),
	}
	minors := [2]int{-1, -1}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		for i, k := range keys {
			if fields[0] != k {
				continue
			}
			if minors[i], err = strconv.Atoi(fields[1]); err != nil || minors[i] < 0 {
				return nil, fmt.Errorf("%s: bad minor %q for %s", migMinorsPath, fields[1], k)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", migMinorsPath, err)
	}
	nodes := make([]string, 0, 2)
	for i, k := range keys {
		if minors[i] < 0 {
			return nil, fmt.Errorf("%s has no entry %s", migMinorsPath, k)
		}
		nodes = append(nodes, CapsDeviceDir+"/nvidia-cap"+strconv.Itoa(minors[i]))
	}
	return nodes, nil
}
