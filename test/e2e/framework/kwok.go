package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// KwokBinary is where hack/build-kwok.sh puts kwok, under the bin dir.
const KwokBinary = "kwok"

// StartKwok runs kwok against the control plane: it keeps the Nodes
// annotated kwok.x-k8s.io/node=fake Ready (heartbeats, leases) and plays
// their pods' lifecycle (Running, then gone when deleted), with its default
// stages, so hundreds of nodes cost one process. It returns once kwok's
// health endpoint answers; the process stops with the control plane.
func (cp *ControlPlane) StartKwok(ctx context.Context) (*Process, error) {
	bin := filepath.Join(cp.BinDir, KwokBinary)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("kwok not found (run hack/build-kwok.sh): %w", err)
	}
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	config, err := writeKwokConfig(cp.Dir)
	if err != nil {
		return nil, err
	}
	proc := NewProcess("kwok", bin, filepath.Join(cp.LogDir, "kwok.log"),
		"--kubeconfig", cp.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
		// Room for thousands of pod IPs; the default /24 has 254.
		"--cidr", "10.128.0.0/12",
		"--node-ip", "127.0.0.1",
		"--server-address", addr,
		"--config", config,
	)
	if err := proc.Start(); err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, proc)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := waitHealthy(ctx, proc, "http://"+addr+"/healthz", ""); err != nil {
		return nil, err
	}
	cp.logf("kwok healthy")
	return proc, nil
}

// kwokConfig: node leases (as kubelets have) rather than a status
// heartbeat per node every few seconds; kwok's default parallelism, which a
// file must state.
const kwokConfig = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodeLeaseDurationSeconds: 40
  nodeLeaseParallelism: 4
  nodePlayStageParallelism: 4
  podPlayStageParallelism: 4
  podsOnNodeSyncParallelism: 1
`

// writeKwokConfig writes kwok's configuration with the stages
// hack/build-kwok.sh copied (kwok has none built in): a file of our own,
// so that a ~/.kwok/kwok.yaml of the user's cannot change what runs.
func writeKwokConfig(dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	stages, err := filepath.Glob(filepath.Join(root, "_output", "kwok", "stages", "*.yaml"))
	if err != nil {
		return "", fmt.Errorf("finding kwok's stages: %w", err)
	}
	if len(stages) == 0 {
		return "", errors.New("no kwok stages in _output/kwok/stages (run hack/build-kwok.sh)")
	}
	docs := []string{kwokConfig}
	for _, path := range stages {
		data, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("reading kwok stage: %w", err)
		}
		docs = append(docs, string(data))
	}
	config := filepath.Join(dir, "kwok.yaml")
	if err := os.WriteFile(config, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
		return "", fmt.Errorf("writing kwok's configuration: %w", err)
	}
	return config, nil
}
