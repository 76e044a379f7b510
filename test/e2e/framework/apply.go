package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// fieldManager owns the fields the tests and the demo apply.
const fieldManager = "gpuaas-e2e"

// YAMLFiles lists the YAML files under path (a file, or a directory walked
// recursively), in lexical order of their paths: that is the apply order,
// so demo/specs/00-catalog comes before the scenarios that use it.
func YAMLFiles(path string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing YAML files in %s: %w", path, err)
	}
	sort.Strings(files)
	return files, nil
}

// ReadObjects decodes every document of a (multi-document) YAML file.
func ReadObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		if len(m) == 0 {
			continue // an empty document, e.g. after a trailing ---
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// Apply server-side-applies every object of path (see YAMLFiles), in order.
// Namespaced objects without a namespace go to defaultNamespace. After a
// Namespace is applied, Apply waits for its default ServiceAccount so that
// pods later in the same file are admitted. It returns what was applied.
func (cp *ControlPlane) Apply(ctx context.Context, path, defaultNamespace string) ([]*unstructured.Unstructured, error) {
	files, err := YAMLFiles(path)
	if err != nil {
		return nil, err
	}
	var applied []*unstructured.Unstructured
	for _, file := range files {
		objs, err := ReadObjects(file)
		if err != nil {
			return applied, err
		}
		for _, obj := range objs {
			out, err := cp.ApplyObject(ctx, obj, defaultNamespace)
			if err != nil {
				return applied, fmt.Errorf("%s: %w", file, err)
			}
			applied = append(applied, out)
		}
	}
	return applied, nil
}

// ApplyObject server-side-applies one object (see Apply).
func (cp *ControlPlane) ApplyObject(ctx context.Context, obj *unstructured.Unstructured, defaultNamespace string) (*unstructured.Unstructured, error) {
	ri, err := cp.resourceFor(obj, defaultNamespace)
	if err != nil {
		return nil, err
	}
	if obj.GetKind() == "Namespace" && obj.GetAPIVersion() == "v1" {
		if err := cp.waitNamespaceNotTerminating(ctx, obj.GetName()); err != nil {
			return nil, err
		}
	}
	out, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return nil, fmt.Errorf("applying %s %s: %w", obj.GetKind(), objectName(obj), err)
	}
	if out.GetKind() == "Namespace" && out.GetAPIVersion() == "v1" {
		if err := WaitForServiceAccount(ctx, cp.Client, out.GetName()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// waitNamespaceNotTerminating waits until the namespace name is not being
// deleted. A test that applies a namespace an earlier test deleted (the
// cleanup does not wait for the namespace controller) would otherwise
// apply it while it terminates and see it vanish a moment later, with
// everything the test put in it (TestShapeWholeNodeLease after
// TestShapeWholeNodeLeaseOnRealNode, once the plugin started a second
// sooner).
func (cp *ControlPlane) waitNamespaceNotTerminating(ctx context.Context, name string) error {
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		ns, err := cp.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return ns.DeletionTimestamp == nil, nil
	})
	if err != nil {
		return fmt.Errorf("namespace %s still terminating: %w", name, err)
	}
	return nil
}

// resourceFor maps the object's kind to its resource; for namespaced kinds
// it fills in the default namespace. A kind unknown to the cached discovery
// (a CRD created a moment ago) triggers one refresh.
func (cp *ControlPlane) resourceFor(obj *unstructured.Unstructured, defaultNamespace string) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := cp.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		cp.mapper.Reset()
		mapping, err = cp.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", gvk, err)
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return cp.Dynamic.Resource(mapping.Resource), nil
	}
	if obj.GetNamespace() == "" {
		if defaultNamespace == "" {
			return nil, fmt.Errorf("%s %s has no namespace and no default was given", gvk.Kind, obj.GetName())
		}
		obj.SetNamespace(defaultNamespace)
	}
	return cp.Dynamic.Resource(mapping.Resource).Namespace(obj.GetNamespace()), nil
}

func objectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}
