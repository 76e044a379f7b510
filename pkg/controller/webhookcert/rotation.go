package webhookcert

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// With the chart, the replicas share one certificate Secret, and
// open-policy-agent's cert-controller keeps it: it makes a CA (kept in the
// Secret with its key, ten years) and a serving certificate signed by it,
// renews the serving certificate ahead of its expiry with the same CA, and
// writes the CA into the chart's webhook configuration. Every replica runs
// it (no leader election); writes to the Secret are checked by its
// resourceVersion.
//
// Each replica serves what the Secret holds now: Served watches the
// Secret and hands the TLS server its current key pair, so a renewal
// reaches every replica at once, with no restart and no wait for a mounted
// volume to refresh. It also writes the files into the cert dir, where the
// rotator checks that the certificates are "mounted".

// rotatorCAName is the CA's common name in the Secret.
const rotatorCAName = "gpuaas-dra-controller-ca"

// secretKey is the cert Secret "namespace/name" of the options.
func (w *Config) secretKey() (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(w.CertSecret, "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, fmt.Errorf("--webhook-cert-secret %q: want namespace/name", w.CertSecret)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// addRotator lets cert-controller keep the Secret and the CA bundle of the
// chart's webhook configuration; ready is closed once the certificates are
// in place and the CA injected.
func addRotator(mgr manager.Manager, w *Config, ready chan struct{}) error {
	key, err := w.secretKey()
	if err != nil {
		return err
	}
	dns := w.DNSNames
	if len(dns) == 0 {
		return errors.New("the webhook certificate Secret needs --webhook-service (the names to certify)")
	}
	r := &rotator.CertRotator{
		SecretKey:      key,
		CertDir:        w.CertDir,
		CAName:         rotatorCAName,
		CAOrganization: "gpuaas",
		DNSName:        dns[0],
		ExtraDNSNames:  dns[1:],
		IsReady:        ready,
		Webhooks: []rotator.WebhookInfo{
			{Name: w.ConfigName, Type: rotator.Validating},
			{Name: w.ConfigName, Type: rotator.Mutating},
		},
		ControllerName: "webhook-cert-rotator",
	}
	if err := rotator.AddRotator(mgr, r); err != nil {
		return fmt.Errorf("adding the webhook certificate rotator: %w", err)
	}
	return nil
}

// Served is the key pair of the cert Secret as last seen.
type Served struct {
	key  types.NamespacedName
	dir  string
	pair atomic.Pointer[tls.Certificate]
}

// watch follows the Secret through the manager's cache (restricted to it,
// see SecretCache).
func (s *Served) watch(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return fmt.Errorf("watching the webhook certificate Secret: %w", err)
	}
	logger := klog.FromContext(ctx).WithName("webhook-cert")
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.update(logger, obj) },
		UpdateFunc: func(_, obj any) { s.update(logger, obj) },
	})
	if err != nil {
		return fmt.Errorf("watching the webhook certificate Secret: %w", err)
	}
	return nil
}

func (s *Served) update(logger klog.Logger, obj any) {
	secret, ok := obj.(*corev1.Secret)
	if !ok || secret.Namespace != s.key.Namespace || secret.Name != s.key.Name {
		return
	}
	certPEM, keyPEM := secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey]
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return // the rotator has not filled it yet
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		logger.Error(err, "Webhook certificate Secret holds no usable key pair", "secret", s.key)
		return
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		logger.Error(err, "Creating the webhook certificate directory", "dir", s.dir)
	}
	for name, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM, caFile: secret.Data[caFile]} {
		if err := writeAtomic(filepath.Join(s.dir, name), data); err != nil {
			logger.Error(err, "Writing the webhook certificate", "dir", s.dir)
		}
	}
	if pair.Leaf != nil {
		webhookCertExpiry.Set(float64(pair.Leaf.NotAfter.Unix()))
	}
	if old := s.pair.Swap(&pair); old != nil {
		logger.Info("Serving the renewed webhook certificate", "secret", s.key, "resourceVersion", secret.ResourceVersion)
	}
}

// getCertificate is the TLS server's source of its certificate.
func (s *Served) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if p := s.pair.Load(); p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("no certificate in Secret %s yet", s.key)
}

// TLSOption makes the webhook server use it.
func (s *Served) TLSOption(c *tls.Config) { c.GetCertificate = s.getCertificate }

// Ready is a readiness check: a replica is ready only with a certificate
// the apiserver trusts.
func (s *Served) Ready(*http.Request) error {
	if s.pair.Load() == nil {
		return fmt.Errorf("no certificate in Secret %s yet", s.key)
	}
	return nil
}

// SecretCache restricts the manager's Secret informer to the one cert
// Secret, which is all the controller may read.
func (s *Served) SecretCache() cache.ByObject {
	return cache.ByObject{
		Namespaces: map[string]cache.Config{s.key.Namespace: {}},
		Field:      fields.OneTermEqualSelector("metadata.name", s.key.Name),
	}
}

// closed tells whether ch is closed, for readiness on the rotator.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// NewServed is nil unless the certificate lives in a Secret the rotator
// keeps (the chart's way); cert-manager's certificates (ExternalCerts) and
// the self-signed ones of a single process are files.
func NewServed(w *Config) (*Served, error) {
	if w.CertSecret == "" || w.ExternalCerts {
		return nil, nil
	}
	key, err := w.secretKey()
	if err != nil {
		return nil, err
	}
	return &Served{key: key, dir: w.CertDir}, nil
}

// SetupRotation starts the rotator and the Secret watch, and makes
// readiness wait for both.
func SetupRotation(ctx context.Context, mgr manager.Manager, w *Config, served *Served) error {
	if served == nil {
		return nil
	}
	ready := make(chan struct{})
	if err := addRotator(mgr, w, ready); err != nil {
		return err
	}
	if err := served.watch(ctx, mgr.GetCache()); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook-cert", served.Ready); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	err := mgr.AddReadyzCheck("webhook-ca-injected", func(*http.Request) error {
		if !closed(ready) {
			return errors.New("webhook certificate not in place or CA not injected yet")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	return nil
}
