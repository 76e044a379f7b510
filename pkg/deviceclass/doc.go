// Package deviceclass renders a GpuProfile (a catalog entry) into the
// resource.k8s.io/v1 DeviceClass the scheduler allocates from, and
// validates profiles with the same CEL compiler the scheduler uses, so a bad
// selector is reported on the profile instead of failing every claim.
//
// It is pure: no client code, tested without a cluster.
package deviceclass
