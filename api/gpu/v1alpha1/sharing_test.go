package v1alpha1

import (
	"strings"
	"testing"
)

func TestDecodeSharingStrategies(t *testing.T) {
	const head = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":`
	for name, tc := range map[string]struct{ raw, wantErr string }{
		"time-slicing":               {head + `{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`, ""},
		"MPS with limits":            {head + `{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`, ""},
		"MPS on MigConfig decodes":   {`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"MigConfig","sharing":{"strategy":"MPS"}}`, ""},
		"unknown interval":           {head + `{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Forever"}}}`, `interval: unsupported value "Forever"`},
		"settings of other strategy": {head + `{"strategy":"TimeSlicing","mpsConfig":{}}}`, "mpsConfig: only allowed with strategy MPS"},
		"time-slice settings on MPS": {head + `{"strategy":"MPS","timeSlicingConfig":{}}}`, "timeSlicingConfig: only allowed with strategy TimeSlicing"},
		"thread percentage 0":        {head + `{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":0}}}`, "out of range 1..100"},
		"thread percentage 101":      {head + `{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":101}}}`, "out of range 1..100"},
		"negative memory limit":      {head + `{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"-1Gi"}}}`, "must be positive"},
		"unknown MPS field named":    {head + `{"strategy":"MPS","mpsConfig":{"threads":5}}}`, `unknown field "sharing.mpsConfig.threads"`},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := Decode([]byte(tc.raw))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if cp := cfg.DeepCopyObject(); cp.(Interface).SharingStrategy() != cfg.SharingStrategy() {
					t.Error("deep copy lost the strategy")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestDecodeNodeConfigSharingModes(t *testing.T) {
	cfg, err := DecodeNodeConfig([]byte(`
apiVersion: gpu.gpuaas.io/v1alpha1
kind: NodeConfig
gpus:
- indexes: [4]
  timeSlicing: {replicas: 4, interval: Short}
- indexes: [5]
  shared: {memory: {min: 2Gi, step: 2Gi}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if ts := cfg.ModeFor(4, "").TimeSlicing; ts == nil || ts.Replicas != 4 || ts.Interval != ShortTimeSlice {
		t.Errorf("GPU 4 mode = %+v", ts)
	}
	sh := cfg.ModeFor(5, "").Shared
	if sh == nil {
		t.Fatal("GPU 5 not shared")
	}
	if minimum, step, def := sh.Memory.Resolved(); minimum.String() != "2Gi" || step.String() != "2Gi" || def.String() != "2Gi" {
		t.Errorf("resolved policy = %s %s %s", minimum.String(), step.String(), def.String())
	}
	cp := cfg.DeepCopyObject().(*NodeConfig)
	cp.GPUs[0].TimeSlicing.Replicas = 8
	if cfg.GPUs[0].TimeSlicing.Replicas != 4 {
		t.Error("deep copy shares the time-slicing mode")
	}
}

func TestDecodeNodeConfigSharingErrors(t *testing.T) {
	const head = "apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\ngpus:\n- indexes: [0]\n"
	for name, tc := range map[string]struct{ in, want string }{
		"zero replicas":      {head + "  timeSlicing: {replicas: 0}\n", "timeSlicing.replicas: 0 is out of range 1..64"},
		"65 replicas":        {head + "  timeSlicing: {replicas: 65}\n", "timeSlicing.replicas: 65 is out of range 1..64"},
		"unknown interval":   {head + "  timeSlicing: {replicas: 2, interval: Eternal}\n", `timeSlicing.interval: unsupported value "Eternal"`},
		"two modes":          {head + "  mig: dynamic\n  timeSlicing: {replicas: 2}\n", "exclusive: a GPU is offered in one mode"},
		"shared and sliced":  {head + "  shared: {}\n  timeSlicing: {replicas: 2}\n", "exclusive"},
		"default off step":   {head + "  shared: {memory: {step: 2Gi, min: 2Gi, default: 3Gi}}\n", "not a multiple of step"},
		"default below min":  {head + "  shared: {memory: {min: 4Gi, default: 2Gi}}\n", "below min"},
		"zero step":          {head + "  shared: {memory: {step: 0}}\n", "must be positive"},
		"unknown field":      {head + "  timeSlicing: {replicas: 2, replica: 3}\n", `unknown field "gpus[0].timeSlicing.replica"`},
		"replicas as string": {head + "  timeSlicing: {replicas: four}\n", "replicas"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeNodeConfig([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
