// Package v1alpha1 holds the opaque device configuration of the gpu.gpuaas.io
// DRA driver: what a DeviceClass or ResourceClaim may say about how an
// allocated device is prepared. The plugin and the admission webhook decode it
// with the same strict decoder, so both refuse the same input.
package v1alpha1
