// Command flakereport reads the `go test -json` streams of repeated runs of
// the same suite (one file per run) and prints each test's pass rate, the
// tests that failed first: what `make e2e-repeat` prints at its end.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is the part of a test2json event the report reads.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// outcome of one test in one run. noResult is a test that started and never
// said how it ended: its package was killed (a timeout, a panic elsewhere).
type outcome int

const (
	passed outcome = iota
	failed
	skipped
	noResult
)

// run is what one stream says: each test's outcome, keyed "pkg.Test/sub",
// and the first lines a failed test printed, for the report.
type run struct {
	name     string // the stream's file
	outcomes map[string]outcome
	failures map[string][]string
}

// parseRun reads one test2json stream. A package that fails with no failed
// test of its own (a build error, a timeout before any test ended) is
// reported as the test "pkg (package)".
func parseRun(r io.Reader) (*run, error) {
	res := &run{outcomes: map[string]outcome{}, failures: map[string][]string{}}
	output := map[string][]string{}
	failedTests := map[string]bool{} // packages with a failed test
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue // a build error's plain text
		}
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("decoding %q: %w", line, err)
		}
		key := e.Package + "." + e.Test
		if e.Test == "" {
			key = e.Package + " (package)"
		}
		switch e.Action {
		case "run":
			res.outcomes[key] = noResult
		case "output":
			if strings.Contains(e.Output, "--- FAIL") || strings.Contains(e.Output, "Error") ||
				strings.Contains(e.Output, "panic:") || strings.Contains(e.Output, "_test.go:") {
				output[key] = append(output[key], strings.TrimSpace(e.Output))
			}
		case "pass":
			if e.Test != "" {
				res.outcomes[key] = passed
			}
		case "skip":
			if e.Test != "" {
				res.outcomes[key] = skipped
			}
		case "fail":
			if e.Test != "" {
				res.outcomes[key] = failed
				res.failures[key] = output[key]
				failedTests[e.Package] = true
			} else if !failedTests[e.Package] {
				res.outcomes[key] = failed
				res.failures[key] = output[key]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the stream: %w", err)
	}
	return res, nil
}

// row is one test across the runs.
type row struct {
	name                          string
	runs, pass, fail, skip, noRes int
}

// tally counts each test's outcomes over the runs, failures first.
func tally(runs []*run) []row {
	rows := map[string]*row{}
	for _, r := range runs {
		for name, o := range r.outcomes {
			rw := rows[name]
			if rw == nil {
				rw = &row{name: name}
				rows[name] = rw
			}
			rw.runs++
			switch o {
			case passed:
				rw.pass++
			case failed:
				rw.fail++
			case skipped:
				rw.skip++
			case noResult:
				rw.noRes++
			}
		}
	}
	out := make([]row, 0, len(rows))
	for _, rw := range rows {
		out = append(out, *rw)
	}
	sort.Slice(out, func(i, j int) bool {
		bi, bj := out[i].fail+out[i].noRes, out[j].fail+out[j].noRes
		if bi != bj {
			return bi > bj
		}
		return out[i].name < out[j].name
	})
	return out
}

func main() {
	all := len(os.Args) > 1 && os.Args[1] == "--all"
	files := os.Args[1:]
	if all {
		files = files[1:]
	}
	if len(files) == 0 {
		fmt.Fprintln(os.Stderr, "usage: flakereport [--all] RUN.json...")
		os.Exit(2)
	}
	var runs []*run
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		r, err := parseRun(bytes.NewReader(data))
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", f, err)
			os.Exit(1)
		}
		r.name = f
		runs = append(runs, r)
		bad := 0
		for _, o := range r.outcomes {
			if o == failed || o == noResult {
				bad++
			}
		}
		fmt.Printf("run %s: %d tests, %d failed or unfinished\n", f, len(r.outcomes), bad)
	}
	var report strings.Builder
	printReport(&report, runs, tally(runs), all)
	fmt.Print(report.String())
}

// printReport prints the tests that failed at least once (every test with
// all), with their pass rates, then the first lines of each failure.
func printReport(w *strings.Builder, runs []*run, rows []row, all bool) {
	fmt.Fprintf(w, "\n%-80s %5s %5s %5s %5s %9s\n", "test", "runs", "pass", "fail", "skip", "pass rate")
	shown := 0
	for _, rw := range rows {
		if !all && rw.fail+rw.noRes == 0 {
			continue
		}
		shown++
		ran := rw.runs - rw.skip
		rate := "-"
		if ran > 0 {
			rate = fmt.Sprintf("%.0f%%", 100*float64(rw.pass)/float64(ran))
		}
		fmt.Fprintf(w, "%-80s %5d %5d %5d %5d %9s\n", rw.name, rw.runs, rw.pass, rw.fail+rw.noRes, rw.skip, rate)
	}
	if shown == 0 {
		fmt.Fprintf(w, "(every one of %d tests passed or was skipped in every run)\n", len(rows))
	}
	for _, r := range runs {
		for name, lines := range r.failures {
			fmt.Fprintf(w, "\n%s, %s:\n", r.name, name)
			for _, l := range lines[:min(len(lines), 8)] {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
}
