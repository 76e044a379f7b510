package main

import (
	"strings"
	"testing"
)

// Two runs of one package: TestA passes in both, TestB/sub fails in the
// second, TestC is skipped, and in the second run TestD started and never
// ended (the package was killed by its timeout).
const (
	firstRun = `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"run","Package":"p","Test":"TestB/sub"}
{"Action":"pass","Package":"p","Test":"TestB/sub"}
{"Action":"pass","Package":"p","Test":"TestB"}
{"Action":"run","Package":"p","Test":"TestC"}
{"Action":"skip","Package":"p","Test":"TestC"}
{"Action":"run","Package":"p","Test":"TestD"}
{"Action":"pass","Package":"p","Test":"TestD"}
{"Action":"pass","Package":"p"}
`
	secondRun = `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"run","Package":"p","Test":"TestB/sub"}
{"Action":"output","Package":"p","Test":"TestB/sub","Output":"    b_test.go:42: the object has been modified\n"}
{"Action":"fail","Package":"p","Test":"TestB/sub"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"run","Package":"p","Test":"TestC"}
{"Action":"skip","Package":"p","Test":"TestC"}
{"Action":"run","Package":"p","Test":"TestD"}
{"Action":"output","Package":"p","Output":"panic: test timed out after 45m0s\n"}
{"Action":"fail","Package":"p"}
`
)

func TestTallyCountsEachTestsOutcomesAcrossRuns(t *testing.T) {
	var runs []*run
	for _, s := range []string{firstRun, secondRun} {
		r, err := parseRun(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	got := map[string]row{}
	for _, rw := range tally(runs) {
		got[rw.name] = rw
	}
	want := map[string]row{
		"p.TestA":     {name: "p.TestA", runs: 2, pass: 2},
		"p.TestB":     {name: "p.TestB", runs: 2, pass: 1, fail: 1},
		"p.TestB/sub": {name: "p.TestB/sub", runs: 2, pass: 1, fail: 1},
		"p.TestC":     {name: "p.TestC", runs: 2, skip: 2},
		"p.TestD":     {name: "p.TestD", runs: 2, pass: 1, noRes: 1},
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: got %+v, want %+v", name, got[name], w)
		}
	}
	// A package that failed with a failed test of its own is that test's
	// failure, not a second one.
	if _, ok := got["p (package)"]; ok {
		t.Errorf("the package's own failure was counted beside its tests': %+v", got["p (package)"])
	}

	var out strings.Builder
	printReport(&out, runs, tally(runs), false)
	for _, s := range []string{"p.TestB/sub", "50%", "b_test.go:42: the object has been modified"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the report lacks %q:\n%s", s, out.String())
		}
	}
	if strings.Contains(out.String(), "p.TestA ") {
		t.Errorf("the report lists TestA, which never failed:\n%s", out.String())
	}
}

func TestAPackageThatFailsAloneIsReported(t *testing.T) {
	r, err := parseRun(strings.NewReader(`build error: undefined: x
{"Action":"output","Package":"q","Output":"FAIL\tq [build failed]\n"}
{"Action":"fail","Package":"q"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if r.outcomes["q (package)"] != failed {
		t.Fatalf("a package that failed to build: got %v, want it failed", r.outcomes)
	}
}
