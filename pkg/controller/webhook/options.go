package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhookcert"
)

// Defaults.
const (
	DefaultConfigName = "gpuaas-dra-controller"
	DefaultPort       = 9443
)

// Options say where the webhook listens and how the apiserver reaches it.
type Options struct {
	Host    string
	Port    int
	CertDir string

	// Exactly one of Service (in-cluster) or URL (tests, demo: the
	// apiserver on the same host) is the webhook's address.
	ServiceNamespace, ServiceName string
	ServicePort                   int32
	URL                           string

	// CertSecret ("namespace/name") shares the self-signed CA and serving
	// certificate between replicas; without it each process makes its own,
	// which suits one replica.
	CertSecret string

	// ExternalCerts: the certificate files in CertDir come from elsewhere
	// (cert-manager); the controller neither writes them nor the caBundle,
	// unless CAFile names the CA to inject.
	ExternalCerts bool
	CAFile        string

	// ConfigName names the ValidatingWebhookConfiguration and the
	// MutatingWebhookConfiguration the controller creates and keeps
	// current (or, ConfigOwnedByChart, injects its CA into).
	ConfigName string
	// TimeoutSeconds of each webhook call (1-30); default 5.
	TimeoutSeconds int32
	// RemoveOnExit deletes the webhook configuration on shutdown (tests,
	// demo): a configuration pointing at a stopped controller with
	// failurePolicy Fail blocks claims.
	RemoveOnExit bool
	// ConfigOwnedByChart: the Helm chart installs (and uninstall removes)
	// the webhook configuration; the controller only injects its CA
	// bundle and never creates or deletes it, so nothing it wrote outlives
	// the release.
	ConfigOwnedByChart bool
}

// Validate checks and defaults the options.
func (w *Options) Validate() error {
	if w.ConfigName == "" {
		w.ConfigName = DefaultConfigName
	}
	if w.Port == 0 {
		w.Port = DefaultPort
	}
	if w.ServicePort == 0 {
		w.ServicePort = 443
	}
	if w.TimeoutSeconds == 0 {
		w.TimeoutSeconds = 5
	}
	hasService, hasURL := w.ServiceName != "", w.URL != ""
	switch {
	case hasService == hasURL:
		return errors.New("webhook: set exactly one of the service (namespace/name) and the URL")
	case hasService && w.ServiceNamespace == "":
		return errors.New("webhook: the service needs a namespace")
	case hasURL:
		u, err := url.Parse(w.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("webhook: URL %q must be https://host:port", w.URL)
		}
	}
	if w.CertSecret != "" && !strings.Contains(w.CertSecret, "/") {
		return fmt.Errorf("webhook: cert secret %q must be namespace/name", w.CertSecret)
	}
	if w.ConfigOwnedByChart && w.RemoveOnExit {
		return errors.New("webhook: a configuration owned by the chart is removed by helm uninstall, not on exit")
	}
	if w.TimeoutSeconds < 1 || w.TimeoutSeconds > 30 {
		return fmt.Errorf("webhook: timeout %ds out of 1-30", w.TimeoutSeconds)
	}
	return nil
}

// dnsNames are the names the serving certificate must carry.
func (w *Options) dnsNames() (dns []string, ips []string) {
	if w.URL != "" {
		u, _ := url.Parse(w.URL)
		host := u.Hostname()
		if isIP(host) {
			return nil, []string{host}
		}
		return []string{host}, nil
	}
	svc := w.ServiceName + "." + w.ServiceNamespace
	return []string{w.ServiceName, svc, svc + ".svc", svc + ".svc.cluster.local"}, nil
}

func isIP(host string) bool { return net.ParseIP(host) != nil }

// CertConfig is what the webhook's certificates need of the options.
func (w *Options) CertConfig() *webhookcert.Config {
	dns, ips := w.dnsNames()
	return &webhookcert.Config{
		CertDir: w.CertDir, CertSecret: w.CertSecret, ExternalCerts: w.ExternalCerts, CAFile: w.CAFile,
		ConfigName: w.ConfigName, DNSNames: dns, IPs: ips,
	}
}
