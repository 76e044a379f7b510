package deviceclass

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	gpuapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// compiler is the DRA CEL compiler of the scheduler, with consumable
// capacity on as it is from Kubernetes 1.36.
var compiler = cel.GetCompiler(cel.Features{EnableConsumableCapacity: true})

// Validate checks a profile: the selector (types, MIG profile name, the CEL
// expression compiled and cost-checked the way the apiserver checks
// DeviceClass selectors), the opaque config (decoded strictly, and of a kind
// that fits the device type), the extended resource name and the price. Errors name
// the field.
func Validate(p *gpuaas.GpuProfile, publishedMig map[string]bool) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	errs = append(errs, validateSelector(spec.Child("selector"), &p.Spec.Selector, publishedMig)...)
	errs = append(errs, validateConfig(spec.Child("config"), p)...)
	errs = append(errs, validateExtendedResourceName(spec.Child("extendedResourceName"), ptr.Deref(p.Spec.ExtendedResourceName, ""))...)
	// A negative price would make the cost counters go down.
	errs = append(errs, p.Spec.Price.Validate(spec.Child("price"))...)
	return errs
}

var deviceTypes = []string{
	string(gpuaas.DeviceTypeGPU), string(gpuaas.DeviceTypeMIG),
	string(gpuaas.DeviceTypeTimeSlice), string(gpuaas.DeviceTypeShared),
}

func validateSelector(path *field.Path, s *gpuaas.ProfileSelector, publishedMig map[string]bool) field.ErrorList {
	var errs field.ErrorList
	if s.Type != "" && !slices.Contains(deviceTypes, string(s.Type)) {
		errs = append(errs, field.NotSupported(path.Child("type"), s.Type, deviceTypes))
	}
	if s.MigProfile != "" {
		errs = append(errs, validateMigProfile(path, s, publishedMig)...)
	}
	if s.MinMemory != nil && s.MinMemory.Sign() <= 0 {
		errs = append(errs, field.Invalid(path.Child("minMemory"), s.MinMemory.String(), "must be positive"))
	}
	if s.CEL != "" {
		errs = append(errs, validateCEL(path.Child("cel"), s.CEL)...)
	}
	return errs
}

func validateMigProfile(path *field.Path, s *gpuaas.ProfileSelector, publishedMig map[string]bool) field.ErrorList {
	p := path.Child("migProfile")
	if s.Type != "" && s.Type != gpuaas.DeviceTypeMIG {
		return field.ErrorList{field.Invalid(p, s.MigProfile, fmt.Sprintf("a MIG profile needs type mig, not %s", s.Type))}
	}
	if !migProfilePattern.MatchString(s.MigProfile) {
		return field.ErrorList{field.Invalid(p, s.MigProfile,
			"not a MIG profile name: want <slices>g.<memory>gb with an optional +me suffix, e.g. 1g.10gb, 3g.40gb")}
	}
	gi := gpuInstanceProfile(s.MigProfile)
	if !knownMigProfiles[gi] && !publishedMig[s.MigProfile] {
		return field.ErrorList{field.Invalid(p, s.MigProfile, fmt.Sprintf(
			"no supported GPU has this MIG profile (a GPU not listed is accepted once a node publishes it); known: %s",
			strings.Join(KnownMigProfiles(), ", ")))}
	}
	return nil
}

// validateCEL compiles the expression as the apiserver does for a
// DeviceClass selector: syntax, types, boolean result, and the worst-case
// cost limit.
func validateCEL(path *field.Path, expr string) field.ErrorList {
	if len(expr) > resourceapi.CELSelectorExpressionMaxLength {
		return field.ErrorList{field.TooLong(path, "", resourceapi.CELSelectorExpressionMaxLength)}
	}
	res := compiler.CompileCELExpression(expr, cel.Options{})
	if res.Error != nil {
		return field.ErrorList{field.Invalid(path, expr, res.Error.Detail)}
	}
	if res.MaxCost > resourceapi.CELSelectorExpressionMaxCost {
		return field.ErrorList{field.Forbidden(path, fmt.Sprintf(
			"too expensive: the worst-case cost %d exceeds the limit %d; make the expression simpler",
			res.MaxCost, resourceapi.CELSelectorExpressionMaxCost))}
	}
	return nil
}

// validateConfig decodes the opaque config strictly (an unknown field is an
// error naming it) and checks its kind fits the selected devices.
func validateConfig(path *field.Path, p *gpuaas.GpuProfile) field.ErrorList {
	cfg := p.Spec.Config
	if cfg == nil || len(cfg.Raw) == 0 {
		return nil
	}
	decoded, err := gpuapi.Decode(cfg.Raw)
	if err != nil {
		return field.ErrorList{field.Invalid(path, string(cfg.Raw), err.Error())}
	}
	kind := decoded.GetObjectKind().GroupVersionKind().Kind
	typ := p.Spec.Selector.Type
	if p.Spec.Selector.MigProfile != "" {
		typ = gpuaas.DeviceTypeMIG
	}
	switch {
	case kind == gpuapi.MigConfigKind && typ != gpuaas.DeviceTypeMIG:
		return field.ErrorList{field.Invalid(path.Child("kind"), kind, "MigConfig applies to MIG devices: set selector.type to mig")}
	case kind == gpuapi.GpuConfigKind && typ == gpuaas.DeviceTypeMIG:
		return field.ErrorList{field.Invalid(path.Child("kind"), kind, "MIG devices are configured with MigConfig")}
	}
	return nil
}

// validateExtendedResourceName follows the rules for extended resources: a
// domain-prefixed name outside kubernetes.io, not starting with
// "requests.".
func validateExtendedResourceName(path *field.Path, name string) field.ErrorList {
	if name == "" {
		return nil
	}
	var errs field.ErrorList
	for _, msg := range validation.IsQualifiedName(name) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	domain, _, hasDomain := strings.Cut(name, "/")
	switch {
	case !hasDomain:
		errs = append(errs, field.Invalid(path, name, "must have a domain prefix, e.g. gpuaas.io/shared-gpu"))
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		errs = append(errs, field.Invalid(path, name, "the kubernetes.io domain is reserved"))
	case strings.HasPrefix(name, "requests."):
		errs = append(errs, field.Invalid(path, name, `must not start with "requests."`))
	}
	return errs
}
