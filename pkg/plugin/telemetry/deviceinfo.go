package telemetry

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// The prepared-device info metric says which claim holds which GPU (and
// MIG device) on this node, for joining GPU telemetry with claims.
// dcgm-exporter labels its series with the GPU's UUID (and the GPU
// instance of a MIG device) and can attribute them to pods itself only for
// NVIDIA's own driver name (docs/monitoring.md), so without this a
// platform could not tell whose claim a busy GPU serves.
func newPreparedDeviceInfo() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "prepared_device_info",
		Help: "1 for each device of a claim prepared on this node: the claim, our device name, the GPU's UUID and, for a dynamic MIG device, its GPU instance and MIG UUID (join with dcgm-exporter's UUID and GPU_I_ID).",
	}, []string{"claim_namespace", "claim_name", "device", "gpu_uuid", "gpu_instance", "mig_uuid"})
}

// SetPreparedClaims reports the prepared claims: their counts and one info
// series per device.
func (m *Metrics) SetPreparedClaims(claims []*checkpoint.Claim) {
	if m == nil {
		return
	}
	m.DeviceInfo.Reset()
	devices := 0
	for _, c := range claims {
		for _, d := range c.Devices {
			devices++
			gi, migUUID := "", ""
			if d.CreatedMIG != nil {
				gi, migUUID = strconv.Itoa(d.CreatedMIG.GIID), d.CreatedMIG.UUID
			}
			m.DeviceInfo.WithLabelValues(c.Namespace, c.Name, d.Device, d.GPUUUID, gi, migUUID).Set(1)
		}
	}
	m.preparedClaims.Set(float64(len(claims)))
	m.preparedDevices.Set(float64(devices))
}
