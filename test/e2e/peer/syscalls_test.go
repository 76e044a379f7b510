package peer

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// syscallsEnv set (PEER_SYSCALLS=1 make bench-peer ...) adds the fsync and
// lock rows. Off by default until a run has shown them: they need strace
// and attach it to both plugins.
const syscallsEnv = "PEER_SYSCALLS"

// tracedSyscalls are what the fsync and lock rows count: the calls that
// make a prepare durable and the calls that serialize it. Both plugins are
// Go: a lock between goroutines of one process (a sync.Mutex) is a futex
// and not counted; NVIDIA's node-wide lock and ours per GPU are flock(2).
const tracedSyscalls = "fsync,fdatasync,syncfs,sync_file_range,flock,fcntl"

// straceRun is strace attached to every thread of one plugin process for a
// window, writing one line per traced call with its start (epoch seconds)
// and its duration. It slows the process, so no latency is measured while
// it is attached.
type straceRun struct {
	cmd    *exec.Cmd
	path   string
	stderr *lockedBuffer
}

// startStrace attaches to pid and returns once strace says it attached.
func startStrace(ctx context.Context, pid int, path string) (*straceRun, error) {
	bin, err := exec.LookPath("strace")
	if err != nil {
		return nil, fmt.Errorf("the fsync and lock rows need strace (apt-get install strace): %w", err)
	}
	s := &straceRun{path: path, stderr: &lockedBuffer{}}
	s.cmd = exec.Command(bin, "-f", "-ttt", "-T", "-e", "trace="+tracedSyscalls, "-o", path, "-p", strconv.Itoa(pid))
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting strace on %d: %w", pid, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(s.stderr.String(), "attached"), nil
	})
	if err != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		return nil, fmt.Errorf("strace did not attach to %d (%s): %w", pid, s.stderr.String(), err)
	}
	return s, nil
}

// stop detaches strace (SIGINT lets it detach cleanly) and parses its log.
func (s *straceRun) stop() ([]sysCall, error) {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	_ = s.cmd.Wait()
	f, err := os.Open(s.path)
	if err != nil {
		return nil, fmt.Errorf("reading strace's log: %w", err)
	}
	defer func() { _ = f.Close() }()
	return parseStrace(f)
}

// sysCall is one finished traced call.
type sysCall struct {
	name  string
	start time.Time
	took  time.Duration
	busy  bool // a lock tried without blocking and found held
}

// straceLine is `PID SECONDS.MICROS name(args) = result <DURATION>`, or the
// resumed half of a call that another thread's line interrupted.
var (
	straceLine    = regexp.MustCompile(`^(?:\d+\s+)?(\d+\.\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)<(\d+\.\d+)>\s*$`)
	straceBusyErr = regexp.MustCompile(`= -1 (EAGAIN|EWOULDBLOCK)\b`)
)

// parseStrace reads strace -f -ttt -T output. An unfinished call is counted
// by its resumed line, which carries its duration; its start is the
// resumed line's time less that duration.
func parseStrace(r io.Reader) ([]sysCall, error) {
	var calls []sysCall
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "<unfinished ...>") {
			continue
		}
		m := straceLine.FindStringSubmatch(line)
		if m == nil {
			continue // signals, exits, attach notes
		}
		at, err := epoch(m[1])
		if err != nil {
			return nil, err
		}
		secs, err := strconv.ParseFloat(m[5], 64)
		if err != nil {
			return nil, fmt.Errorf("strace duration in %q: %w", line, err)
		}
		c := sysCall{name: m[3], start: at, took: time.Duration(secs * float64(time.Second))}
		if m[2] != "" {
			c.name, c.start = m[2], at.Add(-c.took)
		}
		c.busy = straceBusyErr.MatchString(m[4])
		if c.name == "fcntl" && !strings.Contains(m[4], "SETLK") {
			continue // F_GETFL and the like: no lock
		}
		calls = append(calls, c)
	}
	return calls, sc.Err()
}

func epoch(s string) (time.Time, error) {
	sec, frac, _ := strings.Cut(s, ".")
	whole, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("strace time %q: %w", s, err)
	}
	micros, err := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("strace time %q: %w", s, err)
	}
	return time.Unix(whole, micros*1000), nil
}

// window is when one measured call ran, as the benchmark saw it.
type window struct{ start, end time.Time }

// syscallCounts are the traced calls of a set of windows.
type syscallCounts struct {
	ops      int // windows
	syncs    int // fsync, fdatasync, syncfs, sync_file_range
	locks    int // flock and fcntl lock calls, taken or not
	busy     int // lock calls that found the lock held (non-blocking tries)
	lockTime time.Duration
}

// count adds the calls that started inside one of windows.
func count(calls []sysCall, windows []window) syscallCounts {
	c := syscallCounts{ops: len(windows)}
	for _, call := range calls {
		if !inAny(call.start, windows) {
			continue
		}
		switch call.name {
		case "fsync", "fdatasync", "syncfs", "sync_file_range":
			c.syncs++
		case "flock", "fcntl":
			c.locks++
			c.lockTime += call.took
			if call.busy {
				c.busy++
			}
		}
	}
	return c
}

func inAny(t time.Time, windows []window) bool {
	for _, w := range windows {
		if !t.Before(w.start) && !t.After(w.end) {
			return true
		}
	}
	return false
}

// cell is the table's text: per operation, and the fsyncs as the value the
// ratio compares.
func (c syscallCounts) cell() (string, float64) {
	if c.ops == 0 {
		return "", 0
	}
	n := float64(c.ops)
	return fmt.Sprintf("%.1f fsync, %.1f lock (%.1f busy), %.2f ms in lock calls",
		float64(c.syncs)/n, float64(c.locks)/n, float64(c.busy)/n,
		float64(c.lockTime)/float64(time.Millisecond)/n), float64(c.syncs) / n
}

// lockedBuffer is a bytes.Buffer strace's stderr can write to while the
// benchmark reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// traced is how many prepare/unprepare pairs the fsync and lock rows trace
// per level: the counts do not vary with the sample, the time does not
// matter (strace slows every call).
const traced = 5

// measureSyscalls prepares and unprepares traced claims on the measured
// GPU one after another with strace attached to d's plugin, and records
// per prepare and per unprepare its fsyncs and lock calls. It runs after
// the latency samples of its level, never during them.
func measureSyscalls(ctx context.Context, t *table, node *framework.Node, d *driver, level int) error {
	claims, err := createClaims(ctx, d, prefix(d, fmt.Sprint("traced", level)), node.Name, []string{measured}, traced, false)
	if err != nil {
		return err
	}
	s, err := startStrace(ctx, d.proc.Pid(), filepath.Join(cp.LogDir, fmt.Sprintf("strace-%s-%d.txt", d.label, level)))
	if err != nil {
		return err
	}
	var prep, unprep []window
	for _, c := range claims {
		start := time.Now()
		if _, err := d.prepare(ctx, c); err != nil {
			_, _ = s.stop()
			return err
		}
		mid := time.Now()
		if _, err := d.unprepare(ctx, c); err != nil {
			_, _ = s.stop()
			return err
		}
		prep, unprep = append(prep, window{start, mid}), append(unprep, window{mid, time.Now()})
	}
	calls, err := s.stop()
	if err != nil {
		return err
	}
	row := fmt.Sprintf("whole GPU, %d prepared: ", level)
	text, value := count(calls, prep).cell()
	t.set(row+"per prepare: fsyncs, lock calls", d, text, value)
	text, value = count(calls, unprep).cell()
	t.set(row+"per unprepare: fsyncs, lock calls", d, text, value)
	return nil
}
