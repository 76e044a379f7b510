package webhookcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Config is where the webhook's certificates come from and what they
// certify; the controller fills it from its webhook options.
type Config struct {
	// CertDir holds the files the webhook server serves (tls.crt, tls.key,
	// ca.crt).
	CertDir string
	// CertSecret ("namespace/name") shares the self-signed CA and serving
	// certificate between replicas; without it each process makes its own,
	// which suits one replica.
	CertSecret string
	// ExternalCerts: the files in CertDir come from elsewhere
	// (cert-manager); nothing here writes them, and the CA to inject is
	// CAFile's, if any.
	ExternalCerts bool
	CAFile        string
	// ConfigName names the validating and mutating webhook configurations
	// whose caBundle the rotator keeps.
	ConfigName string
	// DNSNames and IPs are what the serving certificate certifies.
	DNSNames, IPs []string
}

// The webhook serves TLS with a certificate the controller makes itself:
// a self-signed CA (its PEM becomes the webhook configuration's caBundle)
// and a serving certificate signed by it for the service's DNS names or the
// URL's host. cert-manager can replace both (ExternalCerts).
const (
	caValidity      = 10 * 365 * 24 * time.Hour
	servingValidity = 365 * 24 * time.Hour

	certFile = "tls.crt"
	keyFile  = "tls.key"
	caFile   = "ca.crt"
)

// certBundle is the CA and the serving certificate with its key, in PEM.
type certBundle struct {
	CA, Cert, Key []byte
}

func newCertBundle(dns, ips []string, now time.Time) (*certBundle, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gpuaas-dra-controller-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: firstOf(dns, ips)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(servingValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dns,
	}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding serving key: %w", err)
	}
	return &certBundle{
		CA:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func firstOf(lists ...[]string) string {
	for _, l := range lists {
		if len(l) > 0 {
			return l[0]
		}
	}
	return "gpuaas-dra-controller"
}

// write puts tls.crt, tls.key (and ca.crt) into dir, each atomically, so
// the webhook server's certificate watcher never reads half a file.
func (b *certBundle) write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating cert dir: %w", err)
	}
	for name, data := range map[string][]byte{certFile: b.Cert, keyFile: b.Key, caFile: b.CA} {
		if err := writeAtomic(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	return atomicfile.Write(path, data, 0o600, "."+filepath.Base(path)+".tmp-*")
}

// Ensure makes sure CertDir holds a usable serving certificate and
// returns the CA to inject (nil: leave the caBundle alone).
func Ensure(ctx context.Context, c client.Client, w *Config, now time.Time) ([]byte, error) {
	if w.ExternalCerts {
		if w.CAFile == "" {
			return nil, nil
		}
		ca, err := os.ReadFile(w.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading webhook CA: %w", err)
		}
		return ca, nil
	}
	if w.CertSecret != "" {
		return nil, secretExists(ctx, c, w)
	}
	b, err := newCertBundle(w.DNSNames, w.IPs, now)
	if err != nil {
		return nil, err
	}
	if err := b.write(w.CertDir); err != nil {
		return nil, err
	}
	return b.CA, nil
}

// secretExists checks the certificate Secret the rotator keeps: the chart
// creates it empty, and the controller may not create Secrets.
func secretExists(ctx context.Context, c client.Client, w *Config) error {
	key, err := w.secretKey()
	if err != nil {
		return err
	}
	var s corev1.Secret
	if err := c.Get(ctx, key, &s); err != nil {
		return fmt.Errorf("webhook certificate Secret %s (the chart creates it empty; the controller fills it): %w", key, err)
	}
	return nil
}
