package v1alpha1

import (
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    SharingStrategy
		wantErr string // substring; empty means success
	}{
		{name: "empty GpuConfig defaults to Exclusive",
			raw: `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig"}`, want: ExclusiveStrategy},
		{name: "explicit Exclusive",
			raw: `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`, want: ExclusiveStrategy},
		{name: "MigConfig",
			raw: `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"MigConfig"}`, want: ExclusiveStrategy},
		{name: "unknown field is named",
			raw:     `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharingg":{}}`,
			wantErr: `unknown field "sharingg"`},
		{name: "unknown nested field is named",
			raw:     `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive","replicas":2}}`,
			wantErr: `unknown field "sharing.replicas"`},
		{name: "unknown kind is named",
			raw:     `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"TpuConfig"}`,
			wantErr: `TpuConfig`},
		{name: "unknown version",
			raw:     `{"apiVersion":"gpu.gpuaas.io/v9","kind":"GpuConfig"}`,
			wantErr: `v9`},
		{name: "unsupported strategy",
			raw:     `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Magic"}}`,
			wantErr: `unsupported value "Magic"`},
		{name: "empty strategy",
			raw:     `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{}}`,
			wantErr: `sharing.strategy: required`},
		{name: "not JSON",
			raw:     `{"apiVersion":`,
			wantErr: `decoding gpu.gpuaas.io opaque configuration`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Decode([]byte(tc.raw))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decode() error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode() unexpected error: %v", err)
			}
			if got := cfg.SharingStrategy(); got != tc.want {
				t.Errorf("SharingStrategy() = %q, want %q", got, tc.want)
			}
		})
	}
}
