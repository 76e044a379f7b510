package controller

import (
	"context"
	"fmt"
	"io/fs"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/config/crd"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/kinds"
)

// crdFieldOwner is the field manager of the CRDs the controller applies.
const crdFieldOwner = "gpuaas-dra-controller"

// ApplyCRDs brings the cluster's gpuaas.io CRDs to the version this binary
// was built with, by server-side apply: helm installs a chart's crds/ once
// and skips them on upgrade, so a newer chart's fields were silently
// dropped. A live CRD with a field or an enum value this binary does not
// know is newer (an old replica during a rollout, a rollback) and left
// alone: applying would drop that field, or refuse that value.
func ApplyCRDs(ctx context.Context, c client.Client) error {
	files, err := fs.Glob(crd.Files, "*.yaml")
	if err != nil {
		return fmt.Errorf("listing embedded CRDs: %w", err)
	}
	for _, name := range files {
		if err := applyCRD(ctx, c, name); err != nil {
			return err
		}
	}
	return nil
}

func applyCRD(ctx context.Context, c client.Client, file string) error {
	raw, err := crd.Files.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading embedded CRD %s: %w", file, err)
	}
	want := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &want.Object); err != nil {
		return fmt.Errorf("decoding embedded CRD %s: %w", file, err)
	}
	logger := klog.FromContext(ctx).WithValues("crd", want.GetName())
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(want.GroupVersionKind())
	err = c.Get(ctx, client.ObjectKey{Name: want.GetName()}, live)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading CRD %s: %w", want.GetName(), err)
	}
	if err == nil {
		if extra := unknownFields(schemaFields(live), schemaFields(want)); len(extra) > 0 {
			logger.Info("Live CRD is newer than this controller; leaving it", "unknownFields", extra)
			return nil
		}
	}
	missing := apierrors.IsNotFound(err)
	err = c.Apply(ctx, client.ApplyConfigurationFromUnstructured(want), client.FieldOwner(crdFieldOwner), client.ForceOwnership)
	if missing && apierrors.IsForbidden(err) {
		// Creating a CRD cannot be limited to our names by RBAC, so the
		// chart does not grant it: a CRD added in a later chart version is
		// created by helm install (crds/), not by helm upgrade. What needs
		// it turns itself off and says so.
		logger.Error(err, "CRD missing and this controller may not create it; apply it from the chart's crds/ directory", "file", file)
		return nil
	}
	if err != nil {
		return fmt.Errorf("applying CRD %s: %w", want.GetName(), err)
	}
	logger.V(2).Info("Applied CRD")
	return nil
}

// schemaFields lists the property paths of every version's schema, e.g.
// "v1alpha1:.spec.cohort".
func schemaFields(u *unstructured.Unstructured) []string {
	versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
	var out []string
	for _, v := range versions {
		vm, ok := v.(map[string]any)
		if !ok {
			continue
		}
		schema, _, _ := unstructured.NestedMap(vm, "schema", "openAPIV3Schema")
		name, _, _ := unstructured.NestedString(vm, "name")
		out = appendProperties(out, name+":", schema)
	}
	return out
}

func appendProperties(out []string, prefix string, schema map[string]any) []string {
	props, _, _ := unstructured.NestedMap(schema, "properties")
	for name, p := range props {
		out = append(out, prefix+"."+name)
		if pm, ok := p.(map[string]any); ok {
			out = appendEnum(out, prefix+"."+name, pm)
			out = appendProperties(out, prefix+"."+name, pm)
			if items, ok := pm["items"].(map[string]any); ok {
				out = appendEnum(out, prefix+"."+name+"[]", items)
				out = appendProperties(out, prefix+"."+name+"[]", items)
			}
		}
	}
	return out
}

// appendEnum lists each value a schema's enum allows as "<path>=<value>":
// a value added in a later release (GpuNode's posture
// ExclusivelyAllocated) makes a live CRD newer as a field does, and an
// older controller that applied its own enum would refuse what the newer
// one writes.
func appendEnum(out []string, path string, schema map[string]any) []string {
	values, _ := schema["enum"].([]any)
	for _, v := range values {
		out = append(out, fmt.Sprintf("%s=%v", path, v))
	}
	return out
}

// unknownFields are the paths of live that want lacks, sorted.
func unknownFields(live, want []string) []string {
	return sets.List(sets.New(live...).Difference(sets.New(want...)))
}

// crdWaitLog is how often a controller waiting for its CRDs says so.
const crdWaitLog = 10 * time.Second

// waitForKinds returns once the API serves every kind, or when ctx ends.
// The controller cannot work without its GpuProfile and TenantQuota CRDs,
// and it exited with "no matches for kind" when it started before they
// were served: right after --apply-crds created them (establishing takes
// a moment), or before helm applied crds/. Waiting keeps it unready, not
// crash-looping, and it says what it waits for.
func waitForKinds(ctx context.Context, m meta.RESTMapper, gvks ...schema.GroupVersionKind) error {
	logger := klog.FromContext(ctx)
	lastLog := time.Time{}
	return wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(context.Context) (bool, error) {
		var missing []string
		var lookupErr error
		for _, gvk := range gvks {
			ok, err := kinds.Served(m, gvk.GroupKind(), gvk.Version)
			if err != nil {
				lookupErr = err
			}
			if !ok {
				missing = append(missing, gvk.GroupKind().String())
			}
		}
		if len(missing) > 0 && time.Since(lastLog) >= crdWaitLog {
			// One line per crdWaitLog, with the API server's error when
			// the lookup failed (unreachable), not one per poll.
			if lookupErr != nil {
				logger.Info("Waiting for the API server to serve these CRDs", "kinds", missing, "err", lookupErr.Error())
			} else {
				logger.Info("Waiting for the API to serve these CRDs (install the chart's crds/, or run with --apply-crds)", "kinds", missing)
			}
			lastLog = time.Now()
		}
		return len(missing) == 0, nil
	})
}
