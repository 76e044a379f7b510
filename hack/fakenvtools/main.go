// Command fakenvtools stands in for the two NVIDIA tools the plugin runs
// from the driver root, nvidia-smi and nvidia-cuda-mps-control, on
// simulated GPU nodes. One static binary serves both: install it as two
// copies named after the tools (CGO_ENABLED=0 go build). It behaves like
// the real tools for the calls the plugin makes and, when
// fake-nvtools.json next to it names a callLog, records each call there
// (see calllog.go) so tests can check what the tools were asked.
//
//	nvidia-smi
//	nvidia-smi compute-policy -i <GPU-UUID> --set-timeslice=<0..3>
//	nvidia-cuda-mps-control -d       start the control daemon in the background
//	nvidia-cuda-mps-control -f       run the control daemon in the foreground
//	nvidia-cuda-mps-control < cmds   send commands to the daemon
//
// The MPS tool reads CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY as
// the real one does.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

const (
	toolSMI = "nvidia-smi"
	toolMPS = "nvidia-cuda-mps-control"
	// configName is looked up next to the binary, so each driver root
	// carries its own settings and the plugin's environment is untouched.
	configName = "fake-nvtools.json"
)

type config struct {
	CallLog string `json:"callLog"`
}

func main() { os.Exit(run()) }

func run() int {
	tool := filepath.Base(os.Args[0])
	switch tool {
	case toolSMI:
		if !logCall(tool, os.Args[1:], "") {
			return 1
		}
		return smi(os.Args[1:])
	case toolMPS:
		return mpsControl(os.Args[1:])
	default:
		fmt.Fprintf(os.Stderr, "fakenvtools: install this binary as %s or %s, not %q\n", toolSMI, toolMPS, tool)
		return 2
	}
}

// loadConfig reads the optional config next to the binary.
func loadConfig() (config, error) {
	exe, err := os.Executable()
	if err != nil {
		return config{}, fmt.Errorf("locating the binary: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(exe), configName))
	if errors.Is(err, fs.ErrNotExist) {
		return config{}, nil
	}
	if err != nil {
		return config{}, fmt.Errorf("reading %s: %w", configName, err)
	}
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return config{}, fmt.Errorf("parsing %s: %w", configName, err)
	}
	// A relative path would depend on the caller's working directory.
	if c.CallLog != "" && !filepath.IsAbs(c.CallLog) {
		return config{}, fmt.Errorf("%s: callLog %q is not an absolute path", configName, c.CallLog)
	}
	return c, nil
}

// logCall records this invocation if the config asks for it, and reports
// whether the tool may go on: a test must not silently lose calls, so a
// config or log that cannot be used fails the call.
func logCall(tool string, args []string, stdin string) bool {
	c, err := loadConfig()
	if err == nil && c.CallLog != "" {
		err = appendCall(c.CallLog, newCallRecord(tool, args, stdin))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (fakenvtools): %v\n", tool, err)
		return false
	}
	return true
}
