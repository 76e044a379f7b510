package webhookcert

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	webhookCertExpiry = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpuaas_webhook_certificate_expiry_timestamp_seconds",
		Help: "When the webhook's serving certificate, as this replica serves it, expires (Unix time); only for the certificate the controller keeps in its Secret.",
	})

	registerOnce sync.Once
)

// RegisterMetrics adds the certificate's metric to controller-runtime's
// registry once per process (served on the manager's metrics endpoint), so
// a controller restarted in the same process (tests) registers it again
// without a panic.
func RegisterMetrics() {
	registerOnce.Do(func() {
		ctrlmetrics.Registry.MustRegister(webhookCertExpiry)
	})
}
