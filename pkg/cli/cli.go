// Package cli holds what both binaries' command lines share: flags that
// fall back to environment variables, klog verbosity and the help text.
package cli

import (
	goflag "flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/gpuaas/gpu-dra-driver/pkg/version"
)

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// Parse adds klog's verbosity flags (the binaries log to stderr, as pods
// should, so klog's file flags are left out), sets the help text and parses
// the command line.
func Parse(fs *pflag.FlagSet, about string) {
	gofs := goflag.NewFlagSet("klog", goflag.ExitOnError)
	klog.InitFlags(gofs)
	fs.AddGoFlag(gofs.Lookup("v"))
	fs.AddGoFlag(gofs.Lookup("vmodule"))
	pflag.Usage = func() {
		fmt.Fprintf(os.Stderr, "%s\n\nFlags (environment variables in brackets):\n", about)
		fs.PrintDefaults()
	}
	printVersion := fs.Bool("version", false, "Print the version, the commit and the Go version, and exit.")
	pflag.Parse()
	if *printVersion {
		fmt.Println(version.String(filepath.Base(os.Args[0])))
		os.Exit(0)
	}
	klog.Background().Info("Starting", "version", version.Version(), "commit", version.Commit(), "go", runtime.Version())
}
