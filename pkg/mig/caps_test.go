package mig_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// migMinors is shaped like the driver's /proc/driver/nvidia-caps/mig-minors:
// global entries, then per GPU one line per possible GPU instance and per
// compute instance in it.
const migMinors = `config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi1/ci1/access 14
gpu1/gi1/access 139
gpu1/gi1/ci0/access  140
gpu10/gi1/access 1164
gpu10/gi1/ci0/access 1165
`

func writeMinors(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mig-minors")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCapDeviceNodes(t *testing.T) {
	path := writeMinors(t, migMinors)
	for _, tc := range []struct {
		gpu, gi, ci int
		want        []mig.CapNode
	}{
		{0, 1, 1, []mig.CapNode{{"/dev/nvidia-caps/nvidia-cap12", 12}, {"/dev/nvidia-caps/nvidia-cap14", 14}}},
		{1, 1, 0, []mig.CapNode{{"/dev/nvidia-caps/nvidia-cap139", 139}, {"/dev/nvidia-caps/nvidia-cap140", 140}}},
		// gpu10 is not gpu1.
		{10, 1, 0, []mig.CapNode{{"/dev/nvidia-caps/nvidia-cap1164", 1164}, {"/dev/nvidia-caps/nvidia-cap1165", 1165}}},
	} {
		got, err := mig.CapDeviceNodes(path, tc.gpu, tc.gi, tc.ci)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("CapDeviceNodes(gpu%d/gi%d/ci%d) = %v, %v; want %v", tc.gpu, tc.gi, tc.ci, got, err, tc.want)
		}
	}
}

func TestCapDeviceNodesErrors(t *testing.T) {
	path := writeMinors(t, migMinors)
	for _, tc := range []struct {
		path        string
		gpu, gi, ci int
		want        string
	}{
		{path, 0, 1, 7, "no entry gpu0/gi1/ci7/access"},
		{path, 2, 1, 0, "no entry gpu2/gi1/access"},
		{writeMinors(t, "gpu0/gi1/access x\ngpu0/gi1/ci0/access 13\n"), 0, 1, 0, `bad minor "x"`},
		{writeMinors(t, "gpu0/gi1/access -3\ngpu0/gi1/ci0/access 13\n"), 0, 1, 0, `bad minor "-3"`},
		{filepath.Join(t.TempDir(), "missing"), 0, 1, 0, "MIG minors: opening"},
	} {
		_, err := mig.CapDeviceNodes(tc.path, tc.gpu, tc.gi, tc.ci)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CapDeviceNodes(gpu%d/gi%d/ci%d) error = %v, want %q", tc.gpu, tc.gi, tc.ci, err, tc.want)
		}
	}
}

// procDevices is shaped like the kernel's /proc/devices: character devices,
// then block devices, which may reuse a name with another major.
const procDevices = `Character devices:
  1 mem
195 nvidia
234 nvidia-caps-imex-channels
237 nvidia-caps
511 nvidia-uvm

Block devices:
  7 loop
238 nvidia-caps
`

func writeDevices(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCapsMajor(t *testing.T) {
	got, err := mig.CapsMajor(writeDevices(t, procDevices))
	if err != nil || got != 237 {
		t.Errorf("CapsMajor = %d, %v; want 237, the character device's", got, err)
	}
}

func TestCapsMajorErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		path, want string
	}{
		"not loaded":       {writeDevices(t, "Character devices:\n195 nvidia\n\nBlock devices:\n237 nvidia-caps\n"), "lists no character device nvidia-caps"},
		"bad major":        {writeDevices(t, "Character devices:\nx nvidia-caps\n"), `bad major "x"`},
		"no such file":     {filepath.Join(t.TempDir(), "devices"), "opening"},
		"no section title": {writeDevices(t, "237 nvidia-caps\n"), "lists no character device"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := mig.CapsMajor(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CapsMajor error = %v, want %q", err, tc.want)
			}
		})
	}
}
