// Package version is the release a binary was built from. The release build
// (make build, make image, make release) sets its variables with -ldflags -X
// from hack/version.sh, the one place the version comes from (git describe):
//
//	-X github.com/gpuaas/gpu-dra-driver/pkg/version.version=0.2.0
//	-X github.com/gpuaas/gpu-dra-driver/pkg/version.commit=<full commit hash>
//
// A binary built without them (go run, go test, a plain go build) reports
// "dev" and takes the commit from the build information the go command
// embeds when it builds in a git work tree.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at build time with -ldflags -X; strings, so that -X can set them.
var (
	version = ""
	commit  = ""
)

// Package is this package's import path, for -ldflags -X.
const Package = "github.com/gpuaas/gpu-dra-driver/pkg/version"

// Version is the release ("0.2.0", or git describe's "0.2.0-3-gabcdef1"
// between releases), or "dev" when the build did not set it.
func Version() string {
	if version == "" {
		return "dev"
	}
	return version
}

// Commit is the git commit the binary was built from: the one the build
// set, else the go command's vcs.revision (with "-dirty" for a modified
// work tree), else "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			if modified == "true" {
				rev += "-dirty"
			}
			return rev
		}
	}
	return "unknown"
}

// String is what --version prints for the command name: its version, the
// commit and the Go version and platform it was built with.
func String(name string) string {
	return fmt.Sprintf("%s %s (commit %s, %s %s/%s)", name, Version(), Commit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
