//go:build !cgo

package main

// probeLibraries says that the driver libraries were not probed: loading
// them takes dlopen, which a static Go binary does not have. The line keeps
// such a build from passing for one whose libraries failed silently.
func probeLibraries() []string {
	return []string{"cuda probe unavailable (built without cgo)"}
}
