// Command versioned parses a command line as the driver's binaries do, for
// TestVersionIsSetAtBuildTime.
package main

import (
	"github.com/spf13/pflag"

	"github.com/gpuaas/gpu-dra-driver/pkg/cli"
)

func main() {
	cli.Parse(pflag.CommandLine, "versioned: a test binary")
}
