package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`

// testRestConfig is the plugin's client configuration from a kubeconfig.
func testRestConfig(t *testing.T) *rest.Config {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(testKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestClientNotThrottledToClientGoDefaults: with client-go's defaults (5
// QPS, burst 10) every prepare waited for two tokens (the helper's GET of
// the claim, our status.devices apply): 396 ms per whole-GPU prepare when
// claims came back to back, and the restart's check of 100 checkpointed
// claims (a GET each) took 19.4 s before the plugin registered (make
// bench-peer, issue 37). The kubelet's own client allows 50 / 100; ours
// adds the start's GETs of up to prepare.MaxClaimGets prepared claims to
// the burst, so the first prepares after a restart do not wait for them.
func TestClientNotThrottledToClientGoDefaults(t *testing.T) {
	cfg := testRestConfig(t)
	if want := 100 + prepare.MaxClaimGets; cfg.QPS < 50 || cfg.Burst < want {
		t.Errorf("client rate %v QPS, burst %d: want at least the kubelet's 50 QPS and a burst of %d (its 100 and the start's GETs)", cfg.QPS, cfg.Burst, want)
	}
}

// TestClientSpeaksProtobuf: the claim GETs on a restarted plugin's path to
// its first prepare are decoded from protobuf, as the kubelet's are, with
// JSON accepted from an API server that has no protobuf for a type.
func TestClientSpeaksProtobuf(t *testing.T) {
	cfg := testRestConfig(t)
	if cfg.ContentType != "application/vnd.kubernetes.protobuf" || !strings.HasPrefix(cfg.AcceptContentTypes, "application/vnd.kubernetes.protobuf,") {
		t.Errorf("client content type %q, accepts %q: want protobuf first", cfg.ContentType, cfg.AcceptContentTypes)
	}
}
