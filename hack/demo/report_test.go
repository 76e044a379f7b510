package main

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func claimWith(alternatives ...any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"kind":     "ResourceClaim",
		"metadata": map[string]any{"namespace": "team-a", "name": "burst"},
		"spec": map[string]any{"devices": map[string]any{"requests": []any{
			map[string]any{"name": "gpu", "firstAvailable": alternatives},
		}}},
	}}
}

func TestDroppedAlternatives(t *testing.T) {
	h100 := map[string]any{"name": "h100", "deviceClassName": "h100"}
	mig := map[string]any{"name": "mig-1g", "deviceClassName": "mig-1g"}
	got := droppedAlternatives([]*unstructured.Unstructured{claimWith(h100, mig)}, []*unstructured.Unstructured{claimWith(mig)})
	if want := []string{"team-a/burst: gpu/h100"}; !slices.Equal(got, want) {
		t.Errorf("dropped %q, want %q", got, want)
	}
	if got := droppedAlternatives([]*unstructured.Unstructured{claimWith(h100, mig)}, []*unstructured.Unstructured{claimWith(h100, mig)}); got != nil {
		t.Errorf("dropped %q from a claim stored as written", got)
	}
}
