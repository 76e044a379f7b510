package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// callRecord is one line of the call log, a JSON Lines file; tests in other
// packages parse it with their own struct, so its shape is the contract:
//
//	{"time":"2025-01-02T15:04:05.123456789Z",
//	 "tool":"nvidia-smi",
//	 "args":["compute-policy","-i","GPU-...","--set-timeslice=3"],
//	 "env":{"CUDA_VISIBLE_DEVICES":"GPU-..."},
//	 "stdin":"get_default_active_thread_percentage\n"}
//
// (one line per call in the file). time is RFC 3339 with nanoseconds, in
// UTC. tool is "nvidia-smi" or "nvidia-cuda-mps-control". args are the
// arguments after the program name, [] for none. env holds only those of
// CUDA_VISIBLE_DEVICES, CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY and
// LD_LIBRARY_PATH and LD_PRELOAD that are set, {} for none. stdin is what an MPS client
// (no arguments) read, its commands; it is absent otherwise, or when empty.
// The foreground daemon (-f) is not recorded: -d, which starts it, is.
type callRecord struct {
	Time  time.Time         `json:"time"`
	Tool  string            `json:"tool"`
	Args  []string          `json:"args"`
	Env   map[string]string `json:"env"`
	Stdin string            `json:"stdin,omitempty"`
}

// recordedEnv is the environment the plugin passes that tests care about.
var recordedEnv = []string{"CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "LD_LIBRARY_PATH", "LD_PRELOAD"}

func newCallRecord(tool string, args []string, stdin string) callRecord {
	r := callRecord{Time: time.Now().UTC(), Tool: tool, Args: append([]string{}, args...), Env: map[string]string{}, Stdin: stdin}
	for _, k := range recordedEnv {
		if v, ok := os.LookupEnv(k); ok {
			r.Env[k] = v
		}
	}
	return r
}

// appendCall appends r as one line to path. Several tools run at once on a
// node; the exclusive lock keeps their lines whole whatever their size or
// the file system, which O_APPEND alone does not promise.
func appendCall(path string, r callRecord) error {
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding the call record: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("opening the call log: %w", err)
	}
	defer func() { _ = f.Close() }() // on errors; closing releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking the call log %s: %w", path, err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("writing the call log: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing the call log: %w", err)
	}
	return nil
}
