// Command callwalk follows one function's calls through a module's code, the
// way a reader does: depth first, in source order, each function once, and
// prints the files the walk is in, one line per stay. A stay is a run of
// code in one file; a return is a stay in a file the walk had already left
// (returns = stays - files). It measures how often following one claim
// through the plugin makes a reader go back to a file (issue 34).
//
//	hack/callwalk/prepare-walk.sh [-v]
//
// (its own module, so that x/tools stays out of the driver's go.mod).
//
// How calls are resolved: a static call goes to its callee; a call through
// an interface goes to the method of every type of the module's packages
// (those under -prefix) that implements it, in name order; a closure is
// walked where it is written (it is almost always called by what it is
// passed to); calls of other function values are not followed. Callees
// outside -prefix are not entered. Test files are not read. With -only,
// an interface call goes only to the implementations it names where any
// implements it: one claim of one device kind. Every branch is walked,
// error paths and undo included, so this counts more than one claim's
// happy path, unless the walk is held to what one test ran: with
// -setup-profile and -run-profile (coverage profiles of a test run without
// and with the call to follow), only calls in blocks that ran more often
// in the second are followed, and only functions of which something ran
// are entered. Two counts are printed: stays counting the way back to a
// caller's file, and stays counting function entries only.
package main

import (
	"flag"
	"fmt"
	"go/token"
	"go/types"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

func main() {
	dir := flag.String("dir", ".", "the module's root")
	prefix := flag.String("prefix", "", "import path prefix of the packages to walk")
	start := flag.String("func", "", "the function to start from, as go/ssa names it")
	verbose := flag.Bool("v", false, "print each function entered")
	setup := flag.String("setup-profile", "", "a coverage profile (go test -covermode=atomic -coverprofile) of the test's set-up alone")
	run := flag.String("run-profile", "", "the same test's profile with the call to follow: only calls in blocks that ran more often in it are followed")
	only := flag.String("only", "", "a regexp: of an interface's implementations, follow only the types it matches, where any does (one device kind, say)")
	flag.Parse()
	if *prefix == "" || *start == "" {
		log.Fatal("-prefix and -func are required")
	}
	cfg := &packages.Config{Mode: packages.LoadAllSyntax, Dir: *dir}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		log.Fatalf("loading packages: %v", err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		os.Exit(1)
	}
	prog, _ := ssautil.AllPackages(pkgs, ssa.InstantiateGenerics)
	prog.Build()
	root, err := filepath.Abs(*dir)
	if err != nil {
		log.Fatal(err)
	}
	w := &walker{prog: prog, prefix: *prefix, root: root, seen: map[*ssa.Function]bool{}, verbose: *verbose,
		only: regexp.MustCompile(*only)}
	if *run != "" {
		if w.ran, err = ranBetween(*setup, *run); err != nil {
			log.Fatal(err)
		}
	}
	w.collectTypes()
	fn := w.find(*start)
	if fn == nil {
		log.Fatalf("no function %s", *start)
	}
	w.walk(fn)
	files := map[string]bool{}
	for _, f := range w.stays {
		files[f] = true
	}
	if *verbose {
		for i, f := range w.entries {
			fmt.Printf("entry %3d %s\n", i+1, f)
		}
	}
	for i, f := range w.stays {
		fmt.Printf("%3d %s\n", i+1, f)
	}
	fmt.Printf("stays %d, files %d, returns to a file already left %d, functions %d\n",
		len(w.stays), len(files), len(w.stays)-len(files), len(w.seen))
	fmt.Printf("counting function entries only: stays %d, returns to a file already left %d\n",
		len(w.entries), len(w.entries)-len(files))
}

type walker struct {
	prog    *ssa.Program
	prefix  string
	root    string
	types   []types.Type // the module's named types and their pointers
	seen    map[*ssa.Function]bool
	stays   []string
	entries []string // the same, counting function entries only (not the way back to a caller)
	verbose bool
	only    *regexp.Regexp
	ran     map[string][]block // by import path/file name; nil: every call
}

// block is a coverage block: from line.col to line.col.
type block struct{ l0, c0, l1, c1 int }

func (b block) holds(p token.Position) bool {
	after := p.Line > b.l0 || p.Line == b.l0 && p.Column >= b.c0
	before := p.Line < b.l1 || p.Line == b.l1 && p.Column <= b.c1
	return after && before
}

// ranBetween are the blocks, by import path/file name, that ran more
// often in the profile run than in setup: what the call followed ran.
func ranBetween(setup, run string) (map[string][]block, error) {
	before, err := readProfile(setup)
	if err != nil {
		return nil, err
	}
	after, err := readProfile(run)
	if err != nil {
		return nil, err
	}
	out := map[string][]block{}
	for key, n := range after {
		if n <= before[key] {
			continue
		}
		file, rng, _ := strings.Cut(key, ":")
		var b block
		if _, err := fmt.Sscanf(rng, "%d.%d,%d.%d", &b.l0, &b.c0, &b.l1, &b.c1); err != nil {
			return nil, fmt.Errorf("block %q: %w", key, err)
		}
		out[file] = append(out[file], b)
	}
	return out, nil
}

// readProfile reads a coverage profile's counts by block
// ("path/file.go:l0.c0,l1.c1"); "" reads as no counts.
func readProfile(name string) (map[string]int, error) {
	out := map[string]int{}
	if name == "" {
		return out, nil
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("reading coverage profile: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) != 3 || strings.HasPrefix(line, "mode:") {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(fields[2], "%d", &n); err != nil {
			return nil, fmt.Errorf("profile line %q: %w", line, err)
		}
		out[fields[0]] += n
	}
	return out, nil
}

// ran tells whether the code at pos in fn ran (always, without -executed).
func (w *walker) didRun(fn *ssa.Function, pos token.Pos) bool {
	if w.ran == nil {
		return true
	}
	p := w.prog.Fset.Position(pos)
	if fn.Pkg == nil || !p.IsValid() {
		return false
	}
	for _, b := range w.ran[fn.Pkg.Pkg.Path()+"/"+filepath.Base(p.Filename)] {
		if b.holds(p) {
			return true
		}
	}
	return false
}

func (w *walker) ours(fn *ssa.Function) bool {
	return fn.Pkg != nil && strings.HasPrefix(fn.Pkg.Pkg.Path(), w.prefix)
}

func (w *walker) collectTypes() {
	for _, p := range w.prog.AllPackages() {
		if !strings.HasPrefix(p.Pkg.Path(), w.prefix) {
			continue
		}
		for _, m := range p.Members {
			if t, ok := m.(*ssa.Type); ok {
				if _, generic := t.Type().(*types.Named); generic && t.Type().(*types.Named).TypeParams().Len() > 0 {
					continue
				}
				w.types = append(w.types, t.Type(), types.NewPointer(t.Type()))
			}
		}
	}
}

func (w *walker) find(name string) *ssa.Function {
	for fn := range ssautil.AllFunctions(w.prog) {
		if fn.String() == name {
			return fn
		}
	}
	return nil
}

// enter records that the walk is in fn's file.
func (w *walker) enter(fn *ssa.Function) {
	w.stays = appendStay(w.stays, w.fileOf(fn))
}

// fileOf is fn's file, relative to the module's root; "" if it has none.
func (w *walker) fileOf(fn *ssa.Function) string {
	pos := w.prog.Fset.Position(fn.Pos())
	if !pos.IsValid() {
		return ""
	}
	file, err := filepath.Rel(w.root, pos.Filename)
	if err != nil {
		return pos.Filename
	}
	return file
}

// appendStay adds file to stays unless the walk is in it already.
func appendStay(stays []string, file string) []string {
	if n := len(stays); file == "" || n > 0 && stays[n-1] == file {
		return stays
	}
	return append(stays, file)
}

func (w *walker) walk(fn *ssa.Function) {
	if w.seen[fn] || !w.ours(fn) || strings.HasSuffix(w.prog.Fset.Position(fn.Pos()).Filename, "_test.go") {
		return
	}
	if fn.Synthetic == "" && !w.ranAny(fn) {
		return // an implementation or branch this run did not take
	}
	w.seen[fn] = true
	if w.verbose {
		fmt.Fprintln(os.Stderr, "enter", fn, w.fileOf(fn))
	}
	w.enter(fn)
	w.entries = appendStay(w.entries, w.fileOf(fn))
	for _, step := range w.steps(fn) {
		w.walk(step)
		w.enter(fn) // back in fn's file
	}
}

// ranAny tells whether any of fn's code ran.
func (w *walker) ranAny(fn *ssa.Function) bool {
	if w.ran == nil {
		return true
	}
	for _, b := range fn.Blocks {
		for _, instr := range b.Instrs {
			if instr.Pos().IsValid() && w.didRun(fn, instr.Pos()) {
				return true
			}
		}
	}
	return false
}

type step struct {
	pos token.Pos
	fn  *ssa.Function
}

// steps are the functions fn goes into, in source order.
func (w *walker) steps(fn *ssa.Function) []*ssa.Function {
	var out []step
	for _, b := range fn.Blocks {
		for _, instr := range b.Instrs {
			if !w.didRun(fn, instr.Pos()) {
				continue
			}
			switch in := instr.(type) {
			case *ssa.MakeClosure:
				out = append(out, step{in.Pos(), in.Fn.(*ssa.Function)})
			case ssa.CallInstruction:
				for _, callee := range w.callees(in.Common(), map[*ssa.Function]bool{}) {
					out = append(out, step{in.Pos(), callee})
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].pos < out[j].pos })
	fns := make([]*ssa.Function, 0, len(out))
	for _, s := range out {
		fns = append(fns, s.fn)
	}
	return fns
}

// callees are the functions call may go into; wrappers are the synthetic
// functions already looked through (one may call itself).
func (w *walker) callees(call *ssa.CallCommon, wrappers map[*ssa.Function]bool) []*ssa.Function {
	if callee := call.StaticCallee(); callee != nil {
		if callee.Synthetic != "" { // a wrapper: what it wraps
			if wrappers[callee] {
				return nil
			}
			wrappers[callee] = true
			var out []*ssa.Function
			for _, b := range callee.Blocks {
				for _, instr := range b.Instrs {
					if c, ok := instr.(ssa.CallInstruction); ok {
						out = append(out, w.callees(c.Common(), wrappers)...)
					}
				}
			}
			return out
		}
		return []*ssa.Function{callee}
	}
	if !call.IsInvoke() {
		return nil
	}
	iface := call.Value.Type().Underlying().(*types.Interface)
	var out []*ssa.Function
	for _, t := range w.types {
		if !types.Implements(t, iface) {
			continue
		}
		if m := w.prog.LookupMethod(t, call.Method.Pkg(), call.Method.Name()); m != nil && w.ours(m) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *ssa.Function) int { return strings.Compare(a.String(), b.String()) })
	if w.only.String() != "" {
		var picked []*ssa.Function
		for _, m := range out {
			if w.only.MatchString(m.Signature.Recv().Type().String()) {
				picked = append(picked, m)
			}
		}
		if len(picked) > 0 {
			return picked
		}
	}
	return out
}
