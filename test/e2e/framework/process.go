package framework

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopTimeout is how long a process gets between SIGTERM and SIGKILL.
const stopTimeout = 10 * time.Second

// Process is one child process (a control-plane component or the plugin)
// whose output goes to a log file that outlives it, so a failed test can be
// diagnosed after the process is gone. It runs in its own process group so
// Stop also ends anything it spawned.
type Process struct {
	Name    string
	Path    string
	Args    []string
	Env     []string // added to the environment of the test process
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid once done is closed
}

// NewProcess describes a process; nothing is started yet.
func NewProcess(name, path, logPath string, args ...string) *Process {
	return &Process{Name: name, Path: path, Args: args, LogPath: logPath}
}

// Start launches the process, appending its stdout and stderr to LogPath.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: already started", p.Name)
	}
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: opening log: %w", p.Name, err)
	}
	_, _ = fmt.Fprintf(logFile, "=== %s start %s: %s %s\n", time.Now().Format(time.RFC3339), p.Name, p.Path, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), p.Env...)
	// Own process group: Stop signals the whole group. Pdeathsig: if the test
	// binary dies without cleanup, the kernel ends the child instead of
	// leaving a stray apiserver holding ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("%s: starting %s: %w", p.Name, p.Path, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		err := cmd.Wait()
		_ = logFile.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}(p.done)
	return nil
}

// Pid returns the process id, 0 when not running.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited reports whether a started process has ended, and how.
func (p *Process) Exited() (bool, error) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false, nil
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after stopTimeout,
// and waits for the process to end. How a process ends after our signal is
// not checked (kube-scheduler exits 1 on SIGTERM); a process that had died
// before Stop is reported. Stopping a stopped process is a no-op.
func (p *Process) Stop() error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	exited, exitErr := p.Exited()
	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	}
	p.mu.Lock()
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if exited {
		return fmt.Errorf("%s had exited before Stop (%w); log: %s", p.Name, exitErr, p.LogPath)
	}
	return nil
}

// Kill sends SIGKILL to the process group, as the kernel's OOM killer or
// a container runtime's kill does, and waits for it to end. Killing a
// stopped process is a no-op.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
	p.mu.Lock()
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
}

// Restart stops and starts the process again with the same arguments; the
// log file continues.
func (p *Process) Restart() error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.Start()
}

// Tail returns the last n lines of the log file.
func (p *Process) Tail(n int) string {
	return tailFile(p.LogPath, n)
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
