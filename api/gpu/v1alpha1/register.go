package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
)

// scheme knows only the opaque configuration kinds, so that any other kind is
// an error that names it.
var scheme = newScheme()

// strictDecoder fails on unknown and duplicate fields and names them.
var strictDecoder = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
	json.SerializerOptions{Strict: true})

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	s.AddKnownTypes(SchemeGroupVersion, &GpuConfig{}, &MigConfig{})
	return s
}

// Decode strictly decodes and validates one opaque configuration object
// (JSON or YAML-as-JSON, as found in DeviceClass and ResourceClaim configs).
func Decode(raw []byte) (Interface, error) {
	obj, _, err := strictDecoder.Decode(raw, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding %s opaque configuration: %w", GroupName, err)
	}
	cfg, ok := obj.(Interface)
	if !ok {
		return nil, fmt.Errorf("decoding %s opaque configuration: unexpected type %T", GroupName, obj)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid %s opaque configuration: %w", GroupName, err)
	}
	return cfg, nil
}
