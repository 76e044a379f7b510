package webhookcert

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

func TestCertBundle(t *testing.T) {
	now := time.Now()
	b, err := newCertBundle(nil, []string{"127.0.0.1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b.Cert)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(b.CA)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now}); err != nil || cert.VerifyHostname("127.0.0.1") != nil {
		t.Fatalf("fresh bundle does not serve 127.0.0.1 under its CA: %v", err)
	}
	dir := t.TempDir()
	if err := b.write(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, certFile), filepath.Join(dir, keyFile)); err != nil {
		t.Fatalf("written pair does not load: %v", err)
	}
	ca, _ := os.ReadFile(filepath.Join(dir, caFile))
	if !x509.NewCertPool().AppendCertsFromPEM(ca) {
		t.Fatal("written CA does not parse")
	}
}

// Issue 12 item 3: a replica served the certificate it made or read at its
// start until it restarted, so after a renewal by another replica it served
// one the webhook configuration no longer trusted, or an expired one. Each
// replica now serves what the Secret holds, from the moment it changes.
func TestServingCertFollowsTheSecret(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs") // made on the first certificate
	s := &Served{key: types.NamespacedName{Namespace: "gpuaas", Name: "webhook-tls"}, dir: dir}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "gpuaas", Name: "webhook-tls", ResourceVersion: "1"}}
	s.update(klog.Background(), secret) // as the chart creates it: empty
	if _, err := s.getCertificate(nil); err == nil || s.Ready(nil) == nil {
		t.Fatal("a certificate served before the Secret holds one")
	}
	for round := range 2 {
		b, err := newCertBundle([]string{"svc.gpuaas.svc"}, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		secret = secret.DeepCopy()
		secret.ResourceVersion = fmt.Sprint(round + 2)
		secret.Data = map[string][]byte{corev1.TLSCertKey: b.Cert, corev1.TLSPrivateKeyKey: b.Key, caFile: b.CA}
		s.update(klog.Background(), secret)
		got, err := s.getCertificate(nil)
		if err != nil || s.Ready(nil) != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		want, _ := pem.Decode(b.Cert)
		if !bytes.Equal(got.Certificate[0], want.Bytes) {
			t.Fatalf("round %d: serving an older certificate than the Secret's", round)
		}
		if onDisk, err := os.ReadFile(filepath.Join(dir, certFile)); err != nil || !bytes.Equal(onDisk, b.Cert) {
			t.Fatalf("round %d: %s not the Secret's certificate (%v)", round, certFile, err)
		}
	}
}
