//go:build tools

// Package tools pins the Kubernetes 1.34.4 control plane and kubelet that the version
// tests run (test/e2e/versions_test.go). It is a module of its own so that
// neither the driver's module nor hack/k8s-bins imports a second
// k8s.io/kubernetes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
