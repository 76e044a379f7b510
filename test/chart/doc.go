// Package chart tests what the Helm chart (deployments/helm/gpuaas-dra)
// renders, without a cluster: helm template, read back as objects. The
// tests need helm in _output/bin (hack/build-helm.sh, make helm); without it
// they skip, except under E2E_REQUIRED=1.
package chart
