package v1alpha1

import (
	"strings"
	"testing"
)

func TestDecodeNodeConfig(t *testing.T) {
	cfg, err := DecodeNodeConfig([]byte(`
apiVersion: gpu.gpuaas.io/v1alpha1
kind: NodeConfig
default: {}
gpus:
- indexes: [0, 1]
  mig: dynamic
- uuids: [GPU-abc]
  mig: static
- indexes: [1]
  mig: static
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		index int
		uuid  string
		want  MigStrategy
	}{{0, "", MigDynamic}, {1, "", MigDynamic}, {5, "GPU-abc", MigStatic}, {7, "GPU-x", ""}} {
		if got := cfg.ModeFor(tc.index, tc.uuid).MIG; got != tc.want {
			t.Errorf("ModeFor(%d, %q) = %q, want %q", tc.index, tc.uuid, got, tc.want)
		}
	}
	if empty, err := DecodeNodeConfig(nil); err != nil || empty.ModeFor(0, "").MIG != "" {
		t.Errorf("empty config: %v %v", empty, err)
	}
}

func TestDecodeNodeConfigErrors(t *testing.T) {
	const head = "apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\n"
	for name, tc := range map[string]struct{ in, want string }{
		"unknown field":        {head + "gpus:\n- indexes: [0]\n  mgi: dynamic\n", `unknown field "gpus[0].mgi"`},
		"bad mig value":        {head + "default: {mig: auto}\n", `default: mig: unsupported value "auto"`},
		"no selector":          {head + "gpus:\n- mig: static\n", "gpus[0]: selects no GPU"},
		"negative index":       {head + "gpus:\n- indexes: [-1]\n", "must not be negative"},
		"promise w/o mig":      {head + "default: {migModeEnabledByAdmin: true}\n", "only meaningful with mig"},
		"wrong kind":           {"apiVersion: gpu.gpuaas.io/v1alpha1\nkind: GpuConfig\n", "GpuConfig"},
		"not yaml":             {"gpus: [", "parsing node configuration"},
		"two errors shown":     {head + "default: {mig: x}\ngpus:\n- mig: static\n", "selects no GPU"},
		"profiles w/o dynamic": {head + "default: {mig: static, migProfiles: [1g.10gb]}\n", "migProfiles: only meaningful with mig: dynamic"},
		"profile twice":        {head + "default: {mig: dynamic, migProfiles: [1g.10gb, 1g.10gb]}\n", `migProfiles: "1g.10gb" is empty or listed twice`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeNodeConfig([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// GPU unit counters are on unless the file turns them off, and a deep copy
// does not share the setting.
func TestNodeConfigUnitCounters(t *testing.T) {
	const head = "apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\n"
	for in, want := range map[string]bool{
		"": true, head: true, head + "gpuUnitCounters: true\n": true, head + "gpuUnitCounters: false\n": false,
	} {
		cfg, err := DecodeNodeConfig([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := cfg.UnitCounters(); got != want {
			t.Errorf("%q: UnitCounters() = %v, want %v", in, got, want)
		}
	}
	if !(*NodeConfig)(nil).UnitCounters() {
		t.Error("no config: unit counters off")
	}
	off := false
	cfg := &NodeConfig{GPUUnitCounters: &off}
	cp := cfg.DeepCopyObject().(*NodeConfig)
	off = true
	if cp.UnitCounters() || cp.GPUUnitCounters == cfg.GPUUnitCounters {
		t.Error("the deep copy shares gpuUnitCounters")
	}
}
