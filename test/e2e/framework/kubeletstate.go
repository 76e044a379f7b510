package framework

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
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

// drACheckpointKind identifies the kubelet's DRA checkpoint file.
var draCheckpointKind = []byte("checkpoint.dra.kubelet.k8s.io")

// PreparedClaims reads the real kubelet's DRA checkpoint: for each claim UID
// it prepared, the devices our driver returned.
func (n *RealNode) PreparedClaims() (map[string][]KubeletDevice, error) {
	var path string
	err := filepath.WalkDir(n.KubeletDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path != "" || filepath.Dir(p) != n.KubeletDir {
			return nil
		}
		if data, err := os.ReadFile(p); err == nil && bytes.Contains(data, draCheckpointKind) {
			path = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("looking for the kubelet's DRA checkpoint: %w", err)
	}
	if path == "" {
		return nil, fmt.Errorf("no DRA checkpoint of the kubelet in %s", n.KubeletDir)
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
