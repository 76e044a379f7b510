package webhook

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	gpuapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

// validateOpaque decodes every opaque configuration meant for our driver
// with the plugin's strict decoder, so a typo fails at `kubectl apply`
// instead of at pod start. Other drivers' configurations are theirs.
func validateOpaque(path *field.Path, configs []resourceapi.DeviceClaimConfiguration) field.ErrorList {
	var errs field.ErrorList
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != gpuapi.DriverName {
			continue
		}
		if _, err := gpuapi.Decode(c.Opaque.Parameters.Raw); err != nil {
			errs = append(errs, field.Invalid(path.Index(i).Child("opaque", "parameters"), string(c.Opaque.Parameters.Raw), err.Error()))
		}
	}
	return errs
}
