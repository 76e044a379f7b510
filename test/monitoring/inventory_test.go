package monitoring

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/usage"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	// Linked for its side effects: controller-runtime registers its own
	// metrics (webhook latency, reconcile errors, certwatcher, workqueue)
	// in ctrlmetrics.Registry from the init functions of the packages the
	// controller uses, so the probe below sees what the controller serves.
	_ "github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
)

// metric is one metric family a binary serves.
type metric struct {
	name string
	// kind is counter, gauge, histogram, summary or "" when unknown.
	kind string
	// labels are its variable labels; nil when they are unknown (metrics
	// of libraries, whose existence alone is probed).
	labels map[string]bool
	// from says where it was found, for messages.
	from string
}

// inventory is every metric family the plugin and the controller register,
// by name.
type inventory map[string]*metric

// recorder is a prometheus.Registerer that keeps the descriptions of what
// is registered with it: the plugin's and the health monitor's
// constructors take a Registerer, so their real collectors are read here,
// and a renamed metric is renamed here too.
type recorder struct {
	inv  inventory
	from string
}

var descRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)

func (r *recorder) Register(c prometheus.Collector) error {
	kind := collectorKind(c)
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("cannot read %s", d)
		}
		labels := map[string]bool{}
		for _, l := range strings.Split(m[2], ",") {
			l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")")
			if l != "" {
				labels[l] = true
			}
		}
		r.inv[m[1]] = &metric{name: m[1], kind: kind, labels: labels, from: r.from}
	}
	return nil
}

// collectorKind is a collector's metric type: from its Go type for a
// vector (which has no series to read yet), else from the one metric it
// collects (Counter and Gauge, Histogram and Summary share method sets, so
// their interfaces cannot tell them apart). "" for collectors of several
// families (Go, process), whose names alone are used.
func collectorKind(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	case prometheus.Metric:
	default:
		return ""
	}
	var pb dto.Metric
	if err := c.(prometheus.Metric).Write(&pb); err != nil {
		return ""
	}
	switch {
	case pb.Counter != nil:
		return "counter"
	case pb.Gauge != nil:
		return "gauge"
	case pb.Histogram != nil:
		return "histogram"
	case pb.Summary != nil:
		return "summary"
	}
	return ""
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// The controller's own metrics are package variables of pkg/controller and
// its sub-packages (one per plane), registered only by controller.Run, so
// they are read from their source: every
// prometheus.New*(Opts{Name: ...}, []string{labels}) call, and every call of
// a helper that passes its string parameter on as the Name (tenantGauge,
// ...). The extractor is checked against the registry on the plugin's and
// health monitor's packages (TestSourceInventoryMatchesRegistry).
func sourceInventory(t *testing.T, dir string) inventory {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatalf("parsing %s: %v", p, err)
		}
		files = append(files, f)
	}
	consts := stringConsts(files)
	inv := inventory{}
	// helpers: function name -> (index of the parameter used as Name, kind, labels)
	type helper struct {
		param  int
		kind   string
		labels []string
	}
	helpers := map[string]helper{}
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			params := map[string]int{}
			i := 0
			for _, field := range fn.Type.Params.List {
				for _, n := range field.Names {
					params[n.Name] = i
					i++
				}
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				kind, opts, labels, ok := promConstructor(call, consts)
				if !ok {
					return true
				}
				if id, ok := opts["Name"].(*ast.Ident); ok {
					if idx, isParam := params[id.Name]; isParam {
						helpers[fn.Name.Name] = helper{param: idx, kind: kind, labels: labels}
					}
				}
				return true
			})
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if name, labels, ok := promDesc(call, consts); ok {
				inv[name] = newMetric(name, descKind(name), labels, dir)
				return true
			}
			if kind, opts, labels, ok := promConstructor(call, consts); ok {
				name, ok := fqName(opts, consts)
				if ok {
					inv[name] = newMetric(name, kind, labels, dir)
				}
				return true
			}
			if id, ok := call.Fun.(*ast.Ident); ok {
				if h, ok := helpers[id.Name]; ok && h.param < len(call.Args) {
					if name, ok := stringValue(call.Args[h.param], consts); ok {
						inv[name] = newMetric(name, h.kind, h.labels, dir)
					}
				}
			}
			return true
		})
	}
	return inv
}

func newMetric(name, kind string, labels []string, from string) *metric {
	m := &metric{name: name, kind: kind, labels: map[string]bool{}, from: from}
	for _, l := range labels {
		m.labels[l] = true
	}
	return m
}

// promDesc recognises prometheus.NewDesc("name", "help", []string{...}, ...):
// the description of a collector's const metrics (pkg/controller/billing
// derives its counters from records at each scrape).
func promDesc(call *ast.CallExpr, consts map[string]string) (string, []string, bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "NewDesc" || len(call.Args) < 3 {
		return "", nil, false
	}
	if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
		return "", nil, false
	}
	name, ok := stringValue(call.Args[0], consts)
	if !ok {
		return "", nil, false
	}
	var labels []string
	if l, ok := call.Args[2].(*ast.CompositeLit); ok {
		for _, e := range l.Elts {
			if s, ok := stringValue(e, consts); ok {
				labels = append(labels, s)
			}
		}
	}
	return name, labels, true
}

// descKind is a const metric's kind, which its Desc does not say: by
// Prometheus' naming convention a _total is a counter.
func descKind(name string) string {
	if strings.HasSuffix(name, "_total") {
		return "counter"
	}
	return "gauge"
}

// promConstructor recognises prometheus.NewX(prometheus.XOpts{...}[, []string{...}]).
func promConstructor(call *ast.CallExpr, consts map[string]string) (string, map[string]ast.Expr, []string, bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", nil, nil, false
	}
	// prometheus: client_golang; metrics: Kubernetes' component-base
	// wrappers (the API server's), which take a pointer to the options.
	if pkg, ok := sel.X.(*ast.Ident); !ok || (pkg.Name != "prometheus" && pkg.Name != "metrics") {
		return "", nil, nil, false
	}
	kinds := map[string]string{
		"NewCounter": "counter", "NewCounterVec": "counter", "NewGauge": "gauge", "NewGaugeVec": "gauge",
		"NewHistogram": "histogram", "NewHistogramVec": "histogram", "NewSummary": "summary", "NewSummaryVec": "summary",
	}
	kind, ok := kinds[sel.Sel.Name]
	if !ok || len(call.Args) == 0 {
		return "", nil, nil, false
	}
	arg := call.Args[0]
	if u, ok := arg.(*ast.UnaryExpr); ok && u.Op == token.AND {
		arg = u.X
	}
	lit, ok := arg.(*ast.CompositeLit)
	if !ok {
		return "", nil, nil, false
	}
	opts := map[string]ast.Expr{}
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok {
				opts[k.Name] = kv.Value
			}
		}
	}
	var labels []string
	if len(call.Args) > 1 {
		if l, ok := call.Args[1].(*ast.CompositeLit); ok {
			for _, e := range l.Elts {
				if s, ok := stringValue(e, consts); ok {
					labels = append(labels, s)
				}
			}
		}
	}
	return kind, opts, labels, true
}

func fqName(opts map[string]ast.Expr, consts map[string]string) (string, bool) {
	name, ok := stringValue(opts["Name"], consts)
	if !ok {
		return "", false
	}
	parts := []string{}
	for _, k := range []string{"Namespace", "Subsystem"} {
		if e, ok := opts[k]; ok {
			v, ok := stringValue(e, consts)
			if !ok {
				return "", false
			}
			if v != "" {
				parts = append(parts, v)
			}
		}
	}
	return strings.Join(append(parts, name), "_"), true
}

func stringValue(e ast.Expr, consts map[string]string) (string, bool) {
	switch v := e.(type) {
	case *ast.BasicLit:
		if v.Kind == token.STRING {
			s, err := strconv.Unquote(v.Value)
			return s, err == nil
		}
	case *ast.Ident:
		s, ok := consts[v.Name]
		return s, ok
	}
	return "", false
}

// stringConsts are the package's string constants (metricsNamespace, ...).
func stringConsts(files []*ast.File) map[string]string {
	consts := map[string]string{}
	for _, f := range files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if s, ok := stringValue(vs.Values[i], nil); ok {
							consts[n.Name] = s
						}
					}
				}
			}
		}
	}
	return consts
}

// registryInventory is what the plugin binary registers: its own metrics
// (prepare telemetry and the use of each claim), the health monitor's,
// read from their real collectors, plus the Go and process collectors
// cmd/dra-kubelet-plugin adds.
func registryInventory() inventory {
	inv := inventory{}
	telemetry.NewMetrics(&recorder{inv: inv, from: "pkg/plugin/telemetry"})
	usage.NewMetrics(&recorder{inv: inv, from: "pkg/plugin/usage"})
	health.NewMetrics(&recorder{inv: inv, from: "pkg/health"})
	r := &recorder{inv: inv, from: "client_golang (cmd/dra-kubelet-plugin)"}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return inv
}

// upstreamMetrics are the library metrics the mixin uses from the
// controller's endpoint (controller-runtime's registry). Their existence is
// probed in ctrlmetrics.Registry (probeRegistered); their labels, which the
// registry does not reveal, are those of controller-runtime v0.25's source.
var upstreamMetrics = map[string]*metric{
	"controller_runtime_webhook_latency_seconds":    {kind: "histogram", labels: set("webhook")},
	"controller_runtime_webhook_requests_total":     {kind: "counter", labels: set("webhook", "code")},
	"controller_runtime_webhook_requests_in_flight": {kind: "gauge", labels: set("webhook")},
	"controller_runtime_reconcile_errors_total":     {kind: "counter", labels: set("controller")},
	"controller_runtime_reconcile_total":            {kind: "counter", labels: set("controller", "result")},
	"controller_runtime_reconcile_time_seconds":     {kind: "histogram", labels: set("controller")},
	"certwatcher_read_certificate_errors_total":     {kind: "counter", labels: set()},
	"certwatcher_read_certificate_total":            {kind: "counter", labels: set()},
	"leader_election_master_status":                 {kind: "gauge", labels: set("name")},
	"workqueue_depth":                               {kind: "gauge", labels: set("controller", "name")},
	// The restarts panel reads it from both binaries; the plugin's comes
	// from registryInventory, this probes the controller's.
	"process_start_time_seconds": {kind: "gauge", labels: set()},
}

func set(labels ...string) map[string]bool {
	m := map[string]bool{}
	for _, l := range labels {
		m[l] = true
	}
	return m
}

// probeRegistered reports whether a metric family of that name is
// registered in controller-runtime's registry: registering a gauge of the
// same name with another help string fails exactly when one is (the
// registry compares descriptions, so a vector without any series counts).
func probeRegistered(name string) bool {
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "gpuaas-dra monitoring test probe"})
	if err := ctrlmetrics.Registry.Register(probe); err != nil {
		return true
	}
	ctrlmetrics.Registry.Unregister(probe)
	return false
}

// apiServerAdmissionMetrics are the API server's admission webhook
// metrics, read from the source of the k8s.io/apiserver this module pins
// (the version the e2e control plane runs): the API server is what sees a
// webhook call fail or time out, which the controller never does.
func apiServerAdmissionMetrics(t *testing.T) inventory {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/apiserver")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m k8s.io/apiserver: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "admission", "metrics")
	inv := sourceInventory(t, dir)
	if inv["apiserver_admission_webhook_rejection_count"] == nil {
		t.Fatalf("no apiserver_admission_webhook_rejection_count in %s", dir)
	}
	return inv
}

// fullInventory is every metric the mixin may use.
func fullInventory(t *testing.T) inventory {
	t.Helper()
	inv := registryInventory()
	for name, m := range controllerInventory(t) {
		inv[name] = m
	}
	for name, m := range apiServerAdmissionMetrics(t) {
		inv[name] = m
	}
	for name, m := range upstreamMetrics {
		if !probeRegistered(name) {
			t.Errorf("%s is not registered in controller-runtime's registry (renamed upstream?)", name)
			continue
		}
		inv[name] = &metric{name: name, kind: m.kind, labels: m.labels, from: "controller-runtime"}
	}
	return inv
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// controllerInventory is the metrics of pkg/controller and of every package
// under it, each package's source read on its own.
func controllerInventory(t *testing.T) inventory {
	t.Helper()
	inv := inventory{}
	err := filepath.WalkDir(filepath.Join(repoRoot(t), "pkg", "controller"), func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		for name, m := range sourceInventory(t, path) {
			inv[name] = m
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestSourceInventoryMatchesRegistry: the source extractor that reads the
// controller's metrics finds, on the plugin's (telemetry) and health monitor's
// packages, exactly what their constructors register, names, kinds and
// labels; so it is trusted on pkg/controller.
func TestSourceInventoryMatchesRegistry(t *testing.T) {
	root := repoRoot(t)
	fromSource := sourceInventory(t, filepath.Join(root, "pkg", "plugin", "telemetry"))
	for n, m := range sourceInventory(t, filepath.Join(root, "pkg", "health")) {
		fromSource[n] = m
	}
	inv := inventory{}
	telemetry.NewMetrics(&recorder{inv: inv})
	health.NewMetrics(&recorder{inv: inv})
	if got, want := describe(fromSource), describe(inv); got != want {
		t.Fatalf("the source extractor disagrees with the registry:\nsource:\n%s\nregistry:\n%s", got, want)
	}
	ctrl := controllerInventory(t)
	// A floor, so that an extractor that silently finds nothing fails.
	for _, name := range []string{"gpuaas_tenant_gpu_units_used", "gpuaas_gpu_posture", "gpuaas_claim_denials_total", "gpuaas_profile_devices_free"} {
		if ctrl[name] == nil {
			t.Errorf("the extractor found no %s in pkg/controller", name)
		}
	}
	t.Logf("pkg/controller registers %d metrics:\n%s", len(ctrl), describe(ctrl))
}

func describe(inv inventory) string {
	var lines []string
	for name, m := range inv {
		var labels []string
		for l := range m.labels {
			labels = append(labels, l)
		}
		sort.Strings(labels)
		lines = append(lines, fmt.Sprintf("%s %s {%s}", name, m.kind, strings.Join(labels, ",")))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
