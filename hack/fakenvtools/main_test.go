package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the built tools and a config whose call log is callLog.
var binDir, callLog string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fnvbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binDir, callLog = filepath.Join(dir, "bin"), filepath.Join(dir, "calls.jsonl")
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "fakenvtools"), ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building: %v\n%s", err, out)
		return 1
	}
	if err := install(binDir, callLog); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// install copies the built binary into dir under both tool names, as the
// tests of the plugin do, with a config naming callLog if not empty.
func install(dir, callLog string) error {
	bin, err := os.ReadFile(filepath.Join(filepath.Dir(binDir), "fakenvtools"))
	if err != nil {
		return fmt.Errorf("reading the binary: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, name := range []string{toolSMI, toolMPS} {
		if err := os.WriteFile(filepath.Join(dir, name), bin, 0o755); err != nil {
			return fmt.Errorf("installing %s: %w", name, err)
		}
	}
	if callLog == "" {
		return nil
	}
	cfg, err := json.Marshal(config{CallLog: callLog})
	if err != nil {
		return fmt.Errorf("encoding the config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, configName), cfg, 0o644); err != nil {
		return fmt.Errorf("writing the config: %w", err)
	}
	return nil
}

type result struct {
	stdout, stderr string
	code           int
}

// runTool runs a tool of dir with the plugin's minimal environment plus env;
// a tool that cannot be run at all is an error and exit code -1.
func runTool(t *testing.T, dir, tool string, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, tool), args...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		// Errorf, not Fatalf: some tests run tools from other goroutines.
		t.Errorf("running %s %v: %v", tool, args, err)
		return result{code: -1}
	}
	return result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// calls returns the records of the call log made since start whose args
// equal args; the log is shared by the tests, and by reruns (-count).
func calls(t *testing.T, start time.Time, tool string, args ...string) []callRecord {
	t.Helper()
	f, err := os.Open(callLog)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []callRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r callRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("call log line %q: %v", sc.Text(), err)
		}
		if !r.Time.Before(start) && r.Tool == tool && slices.Equal(r.Args, args) {
			out = append(out, r)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSMISetTimeslice(t *testing.T) {
	start := time.Now()
	const uuid = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
	env := []string{"CUDA_VISIBLE_DEVICES=" + uuid, "LD_LIBRARY_PATH=/drv/lib"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"compute-policy", "-i", uuid, "--set-timeslice=3"}, "Successfully set timeslice to 3 for GPU " + uuid + "\n"},
		{[]string{"compute-policy", "--set-timeslice", "0", "--id=" + uuid}, "Successfully set timeslice to 0 for GPU " + uuid + "\n"},
	} {
		if r := runTool(t, binDir, toolSMI, env, "", c.args...); r.code != 0 || r.stdout != c.want {
			t.Errorf("%v: %+v, want exit 0 and %q", c.args, r, c.want)
		}
	}
	got := calls(t, start, toolSMI, "compute-policy", "-i", uuid, "--set-timeslice=3")
	if len(got) != 1 {
		t.Fatalf("recorded %d calls, want 1", len(got))
	}
	if want := map[string]string{"CUDA_VISIBLE_DEVICES": uuid, "LD_LIBRARY_PATH": "/drv/lib"}; fmt.Sprint(got[0].Env) != fmt.Sprint(want) || got[0].Stdin != "" || time.Since(got[0].Time) > time.Minute {
		t.Errorf("recorded %+v, want env %v", got[0], want)
	}

	for _, args := range [][]string{
		{"compute-policy", "-i", "0", "--set-timeslice=1"},
		{"compute-policy", "-i", uuid, "--set-timeslice=4"},
		{"compute-policy", "-i", uuid, "--set-timeslice=long"},
		{"compute-policy", "-i", uuid, "--set-timeslice=1", "-i", uuid},
		{"compute-policy", "--set-timeslice=1"},
		{"compute-policy", "-i", uuid, "--set-timeslice"},
		{"compute-policy", "-l"},
		{"-q"},
	} {
		r := runTool(t, binDir, toolSMI, nil, "", args...)
		if r.code != 2 || r.stderr == "" || r.stdout != "" {
			t.Errorf("%v: %+v, want exit 2 and a message", args, r)
		}
		if len(calls(t, start, toolSMI, args...)) == 0 {
			t.Errorf("%v: not recorded", args)
		}
	}
	if r := runTool(t, binDir, toolSMI, nil, ""); r.code != 0 || !strings.Contains(r.stdout, "stand-in nvidia-smi") {
		t.Errorf("no arguments: %+v", r)
	}
}

// TestCallLogConcurrent checks that concurrent calls each leave one whole line.
func TestCallLogConcurrent(t *testing.T) {
	start := time.Now()
	const n = 20
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := range n {
		wg.Go(func() {
			results[i] = runTool(t, binDir, toolSMI, nil, "", "compute-policy", "-i", "GPU-"+strconv.Itoa(1000+i), "--set-timeslice=2")
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 {
			t.Errorf("call %d: %+v", i, r)
		}
		if got := calls(t, start, toolSMI, "compute-policy", "-i", "GPU-"+strconv.Itoa(1000+i), "--set-timeslice=2"); len(got) != 1 {
			t.Errorf("call %d recorded %d times", i, len(got))
		}
	}
}

func TestCallLogUnusable(t *testing.T) {
	bad := t.TempDir()
	if err := install(bad, filepath.Join(bad, "missing", "calls.jsonl")); err != nil {
		t.Fatal(err)
	}
	if r := runTool(t, bad, toolSMI, nil, "", "compute-policy", "-i", "GPU-1234", "--set-timeslice=1"); r.code != 1 || !strings.Contains(r.stderr, "call log") || r.stdout != "" {
		t.Errorf("nvidia-smi with an unwritable call log: %+v, want exit 1", r)
	}
	if r := runTool(t, bad, toolMPS, nil, "", "-d"); r.code != 1 || !strings.Contains(r.stderr, "call log") {
		t.Errorf("nvidia-cuda-mps-control -d with an unwritable call log: %+v, want exit 1", r)
	}

	relative := t.TempDir()
	if err := install(relative, "calls.jsonl"); err != nil {
		t.Fatal(err)
	}
	if r := runTool(t, relative, toolSMI, nil, ""); r.code != 1 || !strings.Contains(r.stderr, "absolute") {
		t.Errorf("relative call log: %+v, want exit 1", r)
	}

	none := t.TempDir()
	if err := install(none, ""); err != nil {
		t.Fatal(err)
	}
	if r := runTool(t, none, toolSMI, nil, ""); r.code != 0 {
		t.Errorf("without a config: %+v, want exit 0", r)
	}
	if err := os.Rename(filepath.Join(none, toolSMI), filepath.Join(none, "fakenvtools")); err != nil {
		t.Fatal(err)
	}
	if r := runTool(t, none, "fakenvtools", nil, ""); r.code != 2 || r.stderr == "" {
		t.Errorf("under another name: %+v, want exit 2", r)
	}
}

// mpsEnv makes pipe and log directories for one daemon; the pipe directory
// is short, since a socket path must fit in 108 bytes.
func mpsEnv(t *testing.T) (env []string, pipeDir, logDir string) {
	t.Helper()
	pipeDir, err := os.MkdirTemp("", "fnv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(pipeDir) })
	logDir = filepath.Join(t.TempDir(), "log")
	env = []string{"CUDA_VISIBLE_DEVICES=GPU-feed-0001", envPipeDir + "=" + pipeDir, envLogDir + "=" + logDir}
	return env, pipeDir, logDir
}

func waitAnswering(t *testing.T, pipeDir string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !answering(pipeDir); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the daemon does not answer")
		}
	}
}

var logLine = regexp.MustCompile(`^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control \d+\] (.*)$`)

// checkStopped checks that the daemon cleaned up and logged its life.
func checkStopped(t *testing.T, pipeDir, logDir string, cmds ...string) {
	t.Helper()
	for _, name := range []string{socketName, pidName} {
		if _, err := os.Stat(filepath.Join(pipeDir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", name, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(logDir, logName))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for line := range strings.Lines(string(b)) {
		m := logLine.FindStringSubmatch(strings.TrimSuffix(line, "\n"))
		if m == nil {
			t.Fatalf("control.log line %q not in the daemon's format", line)
		}
		msgs = append(msgs, m[1])
	}
	want := []string{"Starting control daemon on GPUs GPU-feed-0001"}
	for _, c := range cmds {
		want = append(want, "Cmd: "+c)
	}
	if want = append(want, "Exit"); !slices.Equal(msgs, want) {
		t.Errorf("control.log:\n%s\nwant messages %q", b, want)
	}
}

func TestMPSDaemon(t *testing.T) {
	start := time.Now()
	env, pipeDir, logDir := mpsEnv(t)
	if r := runTool(t, binDir, toolMPS, env, "get_server_list\n"); r.code != 1 || r.stderr != msgNoDaemon+"\n" {
		t.Fatalf("client without a daemon: %+v", r)
	}
	if r := runTool(t, binDir, toolMPS, env, "", "-d"); r.code != 0 || r.stderr != "" {
		t.Fatalf("-d: %+v", r)
	}
	waitAnswering(t, pipeDir)
	pidFile := filepath.Join(pipeDir, pidName)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon is not our child; its pid file goes only when it stops.
	t.Cleanup(func() {
		if _, err := os.Stat(pidFile); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})

	for _, c := range []struct{ in, out string }{
		{"get_default_active_thread_percentage\n", "100.0\n"},
		{"set_default_active_thread_percentage 42.5\nget_default_active_thread_percentage\n", "42.5\n42.5\n"},
		{"set_default_active_thread_percentage 150\n", "Invalid value\n"},
		{"set_default_active_thread_percentage NaN\n", "Invalid value\n"},
		{"get_server_list\n\n", ""},
		{"bogus\n", "Invalid command\n"},
	} {
		if r := runTool(t, binDir, toolMPS, env, c.in); r.code != 0 || r.stdout != c.out || r.stderr != "" {
			t.Errorf("client %q: %+v, want %q", c.in, r, c.out)
		}
	}
	for _, arg := range []string{"-d", "-f"} {
		if r := runTool(t, binDir, toolMPS, env, "", arg); r.code != 1 || r.stderr != msgRunning+"\n" {
			t.Errorf("second daemon %s: %+v, want exit 1", arg, r)
		}
	}
	if r := runTool(t, binDir, toolMPS, env, "", "-x"); r.code != 2 || !strings.Contains(r.stderr, "usage") {
		t.Errorf("-x: %+v, want usage", r)
	}
	if r := runTool(t, binDir, toolMPS, env, "quit\n"); r.code != 0 || r.stdout != "" {
		t.Fatalf("quit: %+v", r)
	}
	// quit returns once the daemon has cleaned up.
	checkStopped(t, pipeDir, logDir, "get_default_active_thread_percentage",
		"set_default_active_thread_percentage 42.5", "get_default_active_thread_percentage",
		"set_default_active_thread_percentage 150", "set_default_active_thread_percentage NaN",
		"get_server_list", "bogus", "quit")
	if r := runTool(t, binDir, toolMPS, env, "get_default_active_thread_percentage\n"); r.code != 1 || r.stderr != msgNoDaemon+"\n" {
		t.Errorf("client after quit: %+v", r)
	}

	if got := calls(t, start, toolMPS, "-d"); !slices.ContainsFunc(got, func(r callRecord) bool {
		return r.Env[envPipeDir] == pipeDir && r.Env[envLogDir] == logDir && r.Env["CUDA_VISIBLE_DEVICES"] == "GPU-feed-0001"
	}) {
		t.Errorf("-d not recorded with its environment: %+v", got)
	}
	if got := calls(t, start, toolMPS); !slices.ContainsFunc(got, func(r callRecord) bool { return r.Env[envPipeDir] == pipeDir && r.Stdin == "quit\n" }) {
		t.Errorf("quit not recorded with its stdin: %+v", got)
	}
	if got := calls(t, start, toolMPS, "-f"); len(got) != 0 {
		t.Errorf("the foreground daemon was recorded: %+v", got)
	}
}

func TestMPSForegroundSIGTERM(t *testing.T) {
	env, pipeDir, logDir := mpsEnv(t)
	// A stale socket of a killed daemon must not stop a new one.
	if err := os.WriteFile(filepath.Join(pipeDir, socketName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, toolMPS), "-f")
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	waitAnswering(t, pipeDir)
	if r := runTool(t, binDir, toolMPS, env, "get_server_list\n"); r.code != 0 {
		t.Fatalf("client: %+v", r)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("daemon after SIGTERM: %v: %s", waitErr, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon still running 10s after SIGTERM")
	}
	checkStopped(t, pipeDir, logDir, "get_server_list")
}
