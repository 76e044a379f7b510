package peer

import (
	"strings"
	"testing"
	"time"
)

// A piece of strace -f -ttt -T output as both plugins produce it: a
// blocking flock interrupted by another thread's line, a non-blocking one
// that found the lock held, an fcntl that locks nothing.
const straceSample = `101 1000.000100 flock(7, LOCK_EX <unfinished ...>
102 1000.000200 fsync(9) = 0 <0.004000>
101 1000.010100 <... flock resumed>) = 0 <0.010000>
103 1000.020000 flock(8, LOCK_EX|LOCK_NB) = -1 EWOULDBLOCK (Resource temporarily unavailable) <0.000010>
103 1000.030000 fcntl(3, F_GETFL) = 0x2 (flags O_RDWR) <0.000005>
103 1000.040000 fcntl(3, F_SETLKW, {l_type=F_WRLCK, l_whence=SEEK_SET, l_start=0, l_len=0}) = 0 <0.002000>
101 1000.050000 fdatasync(4) = 0 <0.001000>
--- SIGURG {si_signo=SIGURG, si_code=SI_TKILL, si_pid=100, si_uid=0} ---
101 2000.000000 fsync(4) = 0 <0.001000>
+++ exited with 0 +++
`

func TestStraceCountsCallsPerWindow(t *testing.T) {
	calls, err := parseStrace(strings.NewReader(straceSample))
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 6 {
		t.Fatalf("parsed %d calls, want 6 (the F_GETFL and the unfinished half left out): %+v", len(calls), calls)
	}
	if calls[1].name != "flock" || !calls[1].start.Equal(time.Unix(1000, 100_000)) {
		t.Errorf("resumed flock = %+v, want flock started at 1000.000100 (its end less its duration)", calls[1])
	}
	second := []window{{start: time.Unix(1000, 0), end: time.Unix(1001, 0)}}
	got := count(calls, second)
	want := syscallCounts{ops: 1, syncs: 2, locks: 3, busy: 1, lockTime: 12010 * time.Microsecond}
	if got != want {
		t.Errorf("count in [1000 s, 1001 s] = %+v, want %+v (the fsync at 2000 s is outside)", got, want)
	}
	text, value := count(calls, append(second, window{start: time.Unix(2000, 0), end: time.Unix(2000, 1)})).cell()
	if want := "1.5 fsync, 1.5 lock (0.5 busy), 6.00 ms in lock calls"; text != want || value != 1.5 {
		t.Errorf("cell of two windows = %q, %v; want %q, 1.5", text, value, want)
	}
}
