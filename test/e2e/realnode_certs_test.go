package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"net"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// testCertificateRenewal: the serving certificate in the chart's Secret is
// renewed while the controller runs (here: its key pair removed, as if
// expired); the running pod serves the renewed one at once, without a
// restart, and claims keep being admitted (issue 12 item 3: a replica served
// what it had at its start until it restarted).
func testCertificateRenewal(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 3*time.Minute)
	pod := chartControllerReplica(t, ctx)
	dep := renderedControllerDeployment(t, ctx, n)
	secrets := cp.Client.CoreV1().Secrets(releaseNamespace)
	name := dep.Name + "-webhook-tls"
	before, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if served := servedCertificate(t, pod); !samePEM(served, before.Data[v1.TLSCertKey]) {
		t.Fatal("the controller serves another certificate than its Secret's")
	}
	renewed := before.DeepCopy()
	delete(renewed.Data, v1.TLSCertKey)
	delete(renewed.Data, v1.TLSPrivateKeyKey)
	if _, err := secrets.Update(ctx, renewed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var after *v1.Secret
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		after, err = secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		cert := after.Data[v1.TLSCertKey]
		return len(cert) > 0 && !bytes.Equal(cert, before.Data[v1.TLSCertKey]), nil
	})
	if err != nil {
		t.Fatalf("no renewed certificate in Secret %s: %v", name, err)
	}
	if !bytes.Equal(after.Data["ca.crt"], before.Data["ca.crt"]) {
		t.Error("the renewal replaced the CA: replicas serving the old certificate would no longer be trusted")
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return samePEM(servedCertificate(t, pod), after.Data[v1.TLSCertKey]), nil
	})
	if err != nil {
		t.Fatalf("the running controller still serves the old certificate: %v", err)
	}
	t.Logf("renewed certificate served %.1fs after the old one was removed", time.Since(start).Seconds())
	ns := cp.CreateNamespace(t, "renewed")
	claim := gpuClaim(ns, "after-renewal", "gpu.gpuaas.io", 1)
	if _, err := cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a claim through the webhook after the renewal: %v", err)
	}
	pod.alive(t, ctx)
}

// servedCertificate is the DER of the certificate the replica presents
// (nil while it presents none).
func servedCertificate(t *testing.T, r *controllerReplica) []byte {
	t.Helper()
	addr := net.JoinHostPort(r.ip, strconv.Itoa(r.webhookPort))
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // we only read the certificate
	if err != nil {
		t.Logf("TLS to the controller at %s: %v", addr, err)
		return nil
	}
	defer func() { _ = conn.Close() }()
	return conn.ConnectionState().PeerCertificates[0].Raw
}

func samePEM(der, pemData []byte) bool {
	block, _ := pem.Decode(pemData)
	return block != nil && bytes.Equal(der, block.Bytes)
}
