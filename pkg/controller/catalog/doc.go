// Package catalog is the catalog plane of the dra-controller: each
// GpuProfile rendered to the DeviceClass it describes (pkg/deviceclass),
// kept as the profile says, drained before it goes, and its status (devices
// matching, allocated, free) reported. It reads the quota books only
// through Devices, and releases its finalizers for an uninstall
// (ReleaseFinalizers).
package catalog
