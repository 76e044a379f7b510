package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Names and messages of the real nvidia-cuda-mps-control.
const (
	envPipeDir     = "CUDA_MPS_PIPE_DIRECTORY"
	envLogDir      = "CUDA_MPS_LOG_DIRECTORY"
	defaultPipeDir = "/tmp/nvidia-mps"
	defaultLogDir  = "/var/log/nvidia-mps"
	socketName     = "control"
	pidName        = "nvidia-cuda-mps-control.pid"
	logName        = "control.log"
	msgRunning     = "An instance of this daemon is already running"
	msgNoDaemon    = "Cannot find MPS control daemon process"
)

// connTimeout bounds one command's exchange, so neither side waits forever
// on a peer that stopped.
const connTimeout = 10 * time.Second

func mpsControl(args []string) int {
	pipeDir, logDir := envOr(envPipeDir, defaultPipeDir), envOr(envLogDir, defaultLogDir)
	switch {
	case len(args) == 1 && args[0] == "-f":
		return runDaemon(pipeDir, logDir)
	case len(args) == 0:
		// The commands are read before anything is sent, so that the call
		// log, written before the work, can hold them.
		in, err := io.ReadAll(os.Stdin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "reading commands: %v\n", err)
			return 1
		}
		if !logCall(toolMPS, args, string(in)) {
			return 1
		}
		return client(pipeDir, string(in))
	}
	if !logCall(toolMPS, args, "") {
		return 1
	}
	if len(args) == 1 && args[0] == "-d" {
		return daemonize(pipeDir)
	}
	fmt.Fprintf(os.Stderr, "usage: %s [-d | -f]   (without arguments: read commands from stdin)\n", toolMPS)
	return 2
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// answering reports whether a daemon accepts connections in pipeDir.
func answering(pipeDir string) bool {
	c, err := net.DialTimeout("unix", filepath.Join(pipeDir, socketName), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// daemonize starts the daemon in the background like the real -d: a copy
// of this binary runs -f in its own session, detached from the caller's
// terminal and output, and is not waited for.
func daemonize(pipeDir string) int {
	if answering(pipeDir) {
		fmt.Fprintln(os.Stderr, msgRunning)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the daemon: %v\n", err)
		return 1
	}
	cmd := exec.Command(exe, "-f")
	cmd.Args[0] = toolMPS // the child dispatches on its name
	// Nil stdio is /dev/null, nil Env is ours. The root as working
	// directory keeps the daemon from pinning the caller's.
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "starting the daemon: %v\n", err)
		return 1
	}
	_ = cmd.Process.Release()
	return 0
}

// daemon is the state of the foreground control daemon.
type daemon struct {
	mu       sync.Mutex
	log      *os.File
	pct      float64
	mem      string // default pinned memory limit of device 0, as set
	stopping bool
	// stop receives the connection of the quit command, answered only
	// once the daemon is gone.
	stop chan net.Conn
}

func runDaemon(pipeDir, logDir string) int {
	if err := serve(pipeDir, logDir); err != nil {
		if errors.Is(err, errRunning) {
			fmt.Fprintln(os.Stderr, msgRunning)
		} else {
			fmt.Fprintf(os.Stderr, "%s: %v\n", toolMPS, err)
		}
		return 1
	}
	return 0
}

var errRunning = errors.New("daemon already running")

func serve(pipeDir, logDir string) error {
	for _, dir := range []string{pipeDir, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	if answering(pipeDir) {
		return errRunning
	}
	// The lock on the pipe directory, held for the daemon's life, keeps two
	// daemons started at once from both taking over the socket.
	lock, err := os.Open(pipeDir)
	if err != nil {
		return fmt.Errorf("opening the pipe directory: %w", err)
	}
	defer func() { _ = lock.Close() }() // closed early on the way out
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return errRunning
		}
		return fmt.Errorf("locking the pipe directory: %w", err)
	}
	logFile, err := os.OpenFile(filepath.Join(logDir, logName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("opening the control log: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	sock, pidFile := filepath.Join(pipeDir, socketName), filepath.Join(pipeDir, pidName)
	// A socket left by a daemon that was killed; no live one holds the lock.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing a stale socket: %w", err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		_ = ln.Close()
		return fmt.Errorf("writing the pid file: %w", err)
	}
	gpus := os.Getenv("CUDA_VISIBLE_DEVICES")
	if gpus == "" {
		gpus = "all" // what the daemon would drive without the variable
	}
	d := &daemon{log: logFile, pct: 100, stop: make(chan net.Conn, 1)}
	d.logf("Starting control daemon on GPUs %s", gpus)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go d.accept(ln)
	var quit net.Conn
	select {
	case quit = <-d.stop:
	case <-sigs:
		d.mu.Lock()
		d.stopping = true
		d.mu.Unlock()
	}
	// Clean up before quit's connection closes: a client's quit then
	// returns only when the daemon is gone, so an immediate restart in the
	// same directory cannot race with this one's exit.
	_ = ln.Close() // also removes the socket
	for _, p := range []string{sock, pidFile} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.logf("Exit: removing %s: %v", p, err)
		}
	}
	d.mu.Lock()
	d.logf("Exit")
	d.mu.Unlock()
	_ = lock.Close()
	if quit != nil {
		_ = quit.Close()
	}
	return nil
}

// logf appends a line in the real daemon's control.log format. It is best
// effort: the daemon's stderr is /dev/null under -d anyway.
func (d *daemon) logf(format string, a ...any) {
	line := fmt.Sprintf("[%s Control %d] %s\n", time.Now().Format("2006-01-02 15:04:05.000"), os.Getpid(), fmt.Sprintf(format, a...))
	_, _ = d.log.WriteString(line)
}

func (d *daemon) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // e.g. out of descriptors: retry
			continue
		}
		go d.handle(c)
	}
}

// handle answers one connection: one command line, one reply, close.
func (d *daemon) handle(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(connTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(line) == "" {
		_ = c.Close() // a probe such as answering(), or a broken client
		return
	}
	reply, quit := d.exec(strings.TrimSpace(line))
	if quit {
		d.stop <- c
		return
	}
	_, _ = io.WriteString(c, reply)
	_ = c.Close()
}

// exec runs one command under the lock; quit reports that the daemon must
// stop.
func (d *daemon) exec(line string) (reply string, quit bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return "", false
	}
	d.logf("Cmd: %s", line)
	f := strings.Fields(line)
	switch {
	case len(f) == 1 && f[0] == "get_default_active_thread_percentage":
		return fmt.Sprintf("%.1f", d.pct), false
	case len(f) == 2 && f[0] == "set_default_active_thread_percentage":
		p, err := strconv.ParseFloat(f[1], 64)
		if err != nil || !(p >= 0 && p <= 100) { // the comparisons also reject NaN
			return "Invalid value", false
		}
		d.pct = p
		return fmt.Sprintf("%.1f", p), false
	case len(f) == 3 && f[0] == "set_default_device_pinned_mem_limit" && f[1] == "0":
		if n := strings.TrimRight(f[2], "KMGT"); n == f[2] || n == "" {
			return "Invalid value", false
		}
		d.mem = f[2]
		return "", false
	case len(f) == 2 && f[0] == "get_default_device_pinned_mem_limit" && f[1] == "0":
		return d.mem, false // nothing when unset, as the real one
	case len(f) == 1 && f[0] == "get_server_list":
		return "", false // no server: they need a GPU
	case len(f) >= 3 && (f[0] == "set_active_thread_percentage" || f[0] == "set_device_pinned_mem_limit"):
		return "Server " + f[1] + " not found", false
	case len(f) == 1 && f[0] == "quit":
		d.stopping = true
		return "", true
	default:
		return "Invalid command", false
	}
}

// client sends each non-empty line of input to the daemon as its own
// connection and prints the replies.
func client(pipeDir, input string) int {
	sock := filepath.Join(pipeDir, socketName)
	for _, line := range strings.Split(input, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		reply, err := ask(sock, line)
		if errors.Is(err, errNoDaemon) {
			fmt.Fprintln(os.Stderr, msgNoDaemon)
			return 1
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if reply != "" {
			fmt.Println(reply)
		}
	}
	return 0
}

var errNoDaemon = errors.New("no daemon")

func ask(sock, line string) (string, error) {
	c, err := net.DialTimeout("unix", sock, connTimeout)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errNoDaemon, err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(connTimeout))
	// A daemon told to quit may close the connection at any point: success.
	quit := line == "quit"
	if _, err := io.WriteString(c, line+"\n"); err != nil && !quit {
		return "", fmt.Errorf("sending %q: %w", line, err)
	}
	reply, err := io.ReadAll(c)
	if err != nil && !quit {
		return "", fmt.Errorf("reading the reply to %q: %w", line, err)
	}
	return string(reply), nil
}
