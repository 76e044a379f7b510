package framework

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// KubeletDevice is one prepared device as the kubelet's DRA manager
// checkpoints it: the request names and CDI device IDs the plugin returned,
// which the kubelet hands to the runtime for the containers using them.
type KubeletDevice struct {
	PoolName     string
	DeviceName   string
	RequestNames []string
	CDIDeviceIDs []string
}

// kubeletCheckpoint mirrors the kubelet's DRA checkpoint (pkg/kubelet/cm/
// dra/state): a JSON document whose Data is itself JSON.
type kubeletCheckpoint struct {
	Data string
}

type kubeletClaimState struct {
	ClaimUID    string
	ClaimName   string
	Namespace   string
	DriverState map[string]struct{ Devices []KubeletDevice }
}

// draCheckpointKind identifies the kubelet's DRA checkpoint file.
var draCheckpointKind = []byte("checkpoint.dra.kubelet.k8s.io")

// findDRACheckpoint finds the DRA manager's checkpoint among the files of
// the kubelet's root dir by its kind (its file name is internal).
func findDRACheckpoint(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("looking for the kubelet's DRA checkpoint: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if data, err := os.ReadFile(path); err == nil && bytes.Contains(data, draCheckpointKind) {
			return path, nil
		}
	}
	return "", fmt.Errorf("no DRA checkpoint of the kubelet in %s", dir)
}

// PreparedClaims reads the real kubelet's DRA checkpoint: for each claim UID
// it prepared, the devices our driver returned.
func (n *RealNode) PreparedClaims() (map[string][]KubeletDevice, error) {
	path, err := findDRACheckpoint(n.KubeletDir)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the kubelet's DRA checkpoint: %w", err)
	}
	var cp kubeletCheckpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	var inner struct{ ClaimInfoStateList []kubeletClaimState }
	if err := json.Unmarshal([]byte(cp.Data), &inner); err != nil {
		return nil, fmt.Errorf("decoding the data of %s: %w", path, err)
	}
	out := map[string][]KubeletDevice{}
	for _, c := range inner.ClaimInfoStateList {
		out[c.ClaimUID] = c.DriverState[DriverName].Devices
	}
	return out, nil
}
