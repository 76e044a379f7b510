// Command demo is what `make demo` runs: a real Kubernetes control plane on
// 127.0.0.1, one GPU node with a mock 8 x H100 NVML, every spec under
// demo/specs applied in order (or those of --specs), and a short account of
// what each pod got, once the pods the specs ask for (a Deployment's
// replicas, a Job's parallelism) run or the timeout passes.
// The node is real where this machine can run one (root, the node binaries
// built): containerd, runc and the kubelet, with the Helm chart installed
// on it, and containers that print what they saw. Otherwise it is
// simulated: the dra-kubelet-plugin binary and the kubelet simulator, with
// the dra-controller binary beside them; one line says why. Both nodes run
// the mock machine of --nvml with the GPU modes of --node-config.
// With the built-in specs it ends with the built-in scenarios (--scenarios):
// health (an XID and a drain on the real node, then the posture table),
// shapes (demo/shapes: a NUMA pair that runs, a whole-node lease and a
// GPU + NIC slot that are refused with the count that says why),
// queueing (demo/queueing: Kueue's manager in front of the GPU quota,
// charging GPU units) and use (demo/usage on the real node: an idle
// notebook and a busy trainer on one time-sliced GPU, what the plugin
// measured of each, and the idle policy evicting the notebook); with specs
// of one's own they run only when asked.
// On the real node a Prometheus scrapes the chart throughout (make
// prometheus); the demo ends with where the chart's dashboards and rules
// are and a few numbers read back through Prometheus's API (prometheus.go).
// Everything is stopped at the end, or on Ctrl-C; with --keep the cluster
// stays up until Ctrl-C (or SIGTERM), also after a failure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

type options struct {
	keep         bool
	pluginBinary string
	specs        string
	nodeName     string
	nvml         string
	nodeConfig   string
	nodeMode     string
	timeout      time.Duration
	// builtinSpecs: --specs is the default demo/specs.
	builtinSpecs bool
	// scenarios are the built-in scenarios to run (--scenarios).
	scenarios scenarios
	// nodeConfigValue is --node-config as the chart's nodeConfig value,
	// read (and checked) before anything starts.
	nodeConfigValue map[string]any
}

func main() {
	opts := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first Ctrl-C, a second one ends the demo at once (children
	// die with it: they are started with a parent-death signal).
	go func() { <-ctx.Done(); stop() }()
	os.Exit(run(ctx, opts, printer{os.Stdout}))
}

func parseFlags() options {
	var o options
	flag.BoolVar(&o.keep, "keep", false, "leave the cluster up when the demo ends, also after a failure, until Ctrl-C (prints the kubeconfig path)")
	flag.StringVar(&o.pluginBinary, "plugin-binary", "", "dra-kubelet-plugin to run; default: build ./cmd/dra-kubelet-plugin")
	flag.StringVar(&o.specs, "specs", "", "directory of specs to apply; default: <repo>/demo/specs")
	scenariosFlag := flag.String("scenarios", "", "built-in scenarios to run after the specs: all, none, or a list of health,shapes,queueing,use; default: all with the built-in specs, none with --specs of one's own")
	flag.StringVar(&o.nodeName, "node-name", "gpu-node-1", "name of the simulated node")
	flag.StringVar(&o.nodeConfig, "node-config", "demo/node-config.yaml", "the plugin's --node-config (how each GPU is offered); \"\" offers every GPU whole")
	flag.StringVar(&o.nvml, "nvml", "mock:dgxh100", "the plugin's --nvml (mock:dgxa100|dgxh100|dgxh200|dgxb200)")
	flag.StringVar(&o.nodeMode, "node", "auto", "real (containerd + kubelet + the Helm chart), sim (kubelet simulator), or auto: real where the machine can run one")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long to wait for the pods")
	flag.Parse()
	if o.nodeMode != "auto" && o.nodeMode != "real" && o.nodeMode != "sim" {
		fmt.Fprintf(os.Stderr, "--node=%q: want auto, real or sim\n", o.nodeMode)
		os.Exit(2)
	}
	// Wrong values are refused here, in one line, rather than minutes
	// later by a node that has started.
	root, err := framework.RepoRoot()
	if err == nil {
		o.builtinSpecs = isBuiltinSpecs(o.specs, root)
		o.scenarios, err = parseScenarios(*scenariosFlag, o.builtinSpecs)
	}
	if err == nil {
		err = checkNVML(o.nvml)
	}
	if err == nil {
		o.nodeConfigValue, err = readNodeConfig(o.nodeConfig)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return o
}

// run returns the exit code. On failure the work dir with all logs is kept.
// With --keep the cluster stays up until ctx ends, whatever happened.
func run(ctx context.Context, opts options, out printer) int {
	d := &demo{opts: opts, out: out}
	err := d.run(ctx)
	reported := false
	if keepAfter(opts.keep, err) && d.cp != nil {
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
			reported = true
		}
		d.hold(ctx, err != nil)
	}
	if errors.Is(err, context.Canceled) {
		out.printf("Interrupted.\n")
		err = nil
	}
	stopErr := d.stop(ctx)
	switch {
	case err != nil || stopErr != nil:
		if failed := errors.Join(err, stopErr); !reported || stopErr != nil {
			fmt.Fprintf(os.Stderr, "demo failed: %v\n", failed)
		}
		if d.cp != nil {
			fmt.Fprintf(os.Stderr, "logs kept in %s\n", d.cp.LogDir)
		}
		return 1
	case d.cp != nil:
		if err := d.cp.Cleanup(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	return 0
}

// printer writes the demo's account; a failed write to the terminal is not
// worth stopping the demo for.
type printer struct{ w io.Writer }

func (p printer) printf(format string, args ...any) { _, _ = fmt.Fprintf(p.w, format, args...) }

// hold keeps the cluster up (--keep) until ctx ends: Ctrl-C, or SIGTERM
// from another terminal, since the components are this process's children
// and end with it.
func (d *demo) hold(ctx context.Context, failed bool) {
	state := "Cluster left running (--keep)."
	if failed {
		state = "The demo failed; cluster left running (--keep) as it was."
	}
	d.out.printf("\n%s To reach it:\n  export KUBECONFIG=%s\n  %s get pods -A\n", state,
		d.cp.Kubeconfig, filepath.Join(d.cp.BinDir, "kubectl"))
	d.out.printf("Logs are in %s.\nTo stop it and everything the demo started: Ctrl-C here, or `kill %d` from another terminal.\n",
		d.cp.LogDir, os.Getpid())
	<-ctx.Done()
}

// demo holds what was started, so stop can undo it whatever step failed.
type demo struct {
	opts        options
	out         printer
	cp          *framework.ControlPlane
	node        gpuNode
	nodeCDIRoot string
	sim         *framework.Node
	real        *framework.RealNode
	controller  *framework.Process
	// prom scrapes the chart on the real node; promErr is why it did not start.
	prom    *framework.Prometheus
	promErr error
	// specPodsDeleted: the scenarios freed the specs' GPUs already.
	specPodsDeleted bool
	// usePID is the process the use scenario runs on the simulated GPU,
	// 0 when none.
	usePID uint32
}

func (d *demo) run(ctx context.Context) error {
	if err := d.startCluster(ctx); err != nil {
		return err
	}
	if d.real != nil {
		d.startPrometheus(ctx)
	}
	begin := time.Now()
	objs, err := d.applySpecs(ctx)
	if err != nil {
		return err
	}
	pods, err := d.waitForPods(ctx, objs, begin)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := d.report(ctx, pods); err != nil {
		return err
	}
	scen := d.opts.scenarios
	if scen.health {
		if err := d.healthScenario(ctx); err != nil {
			return err
		}
	}
	if err := d.reportPosture(ctx, scen.health && d.real != nil); err != nil {
		return err
	}
	if scen.shapes {
		if err := d.shapesScenario(ctx, objs); err != nil {
			return err
		}
	}
	if scen.queueing {
		if err := d.queueingScenario(ctx, objs); err != nil {
			return err
		}
	}
	if scen.use {
		if err := d.useScenario(ctx, objs); err != nil {
			return err
		}
	}
	if !scen.health && !scen.shapes && !scen.queueing && !scen.use {
		d.out.printf("\nBuilt-in scenarios not run (they go with the built-in specs; --scenarios=%s runs them).\n", strings.Join(scenarioNames, ","))
	}
	if err := d.reportStatements(ctx); err != nil {
		return err
	}
	d.reportMonitoring(ctx)
	return nil
}

func (d *demo) startCluster(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "gpuaas-demo-")
	if err != nil {
		return fmt.Errorf("creating work dir: %w", err)
	}
	begin := time.Now()
	d.out.printf("Starting the control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) ...\n")
	d.cp, err = framework.Start(ctx, framework.Options{Dir: dir, Verbosity: 2})
	if err != nil {
		return err
	}
	d.out.printf("  ready in %.1fs; logs in %s\n", time.Since(begin).Seconds(), d.cp.LogDir)
	switch why := realNodeUnavailable(d.cp); {
	case d.opts.nodeMode == "real":
		return d.startRealNode(ctx)
	case d.opts.nodeMode == "sim":
	case why != "":
		d.out.printf("No real node here (%s); using the kubelet simulator.\n", why)
	default:
		err := d.startRealNode(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		d.out.printf("The real node did not start (%v); using the kubelet simulator.\n", firstLine(err))
		if d.real != nil {
			_ = d.stopRealNode(ctx)
			d.real = nil
		}
	}
	return d.startSimNode(ctx)
}

func firstLine(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// startSimNode runs the plugin binary with the kubelet simulator, and the
// controller binary.
func (d *demo) startSimNode(ctx context.Context) error {
	if err := framework.LogToFile(filepath.Join(d.cp.LogDir, "kubeletsim.log"), 4); err != nil {
		return err
	}
	var err error
	if d.opts.pluginBinary == "" {
		d.out.printf("Building dra-kubelet-plugin ...\n")
		if d.opts.pluginBinary, err = framework.BuildPlugin(ctx, d.cp.Dir); err != nil {
			return err
		}
	}
	if err := d.startController(ctx); err != nil {
		return err
	}
	d.out.printf("Starting node %s (plugin with --nvml=%s, kubelet simulator) ...\n", d.opts.nodeName, d.opts.nvml)
	d.sim, err = d.cp.StartNode(ctx, framework.NodeOptions{
		Name: d.opts.nodeName, PluginBinary: d.opts.pluginBinary, NVML: d.opts.nvml,
		NodeConfig: d.opts.nodeConfig,
	})
	if err != nil {
		return err
	}
	d.node, d.nodeCDIRoot = d.sim, d.sim.CDIRoot
	return d.describeNode(ctx)
}

// applySpecs applies every YAML file under the specs directory in order
// and returns the applied objects.
func (d *demo) applySpecs(ctx context.Context) ([]*unstructured.Unstructured, error) {
	specs := d.opts.specs
	if specs == "" {
		root, err := framework.RepoRoot()
		if err != nil {
			return nil, err
		}
		specs = filepath.Join(root, "demo", "specs")
	}
	if !d.opts.builtinSpecs {
		if err := d.applyCatalog(ctx); err != nil {
			return nil, err
		}
	}
	files, err := framework.YAMLFiles(specs)
	if err != nil {
		return nil, err
	}
	d.out.printf("Applying %d files from %s ...\n", len(files), specs)
	width := 0
	for _, file := range files {
		width = max(width, len(file)-len(specs))
	}
	var all []*unstructured.Unstructured
	var denials []framework.Denial
	var trims []string
	for _, file := range files {
		objs, err := framework.ReadObjects(file)
		if err != nil {
			return nil, err
		}
		if d.real != nil {
			if err := useWorkload(objs); err != nil {
				return nil, err
			}
		}
		stored, denied, err := d.cp.ApplyObjects(ctx, file, objs, "default")
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(specs, file)
		d.out.printf("  %-*s %s\n", width, rel, kinds(stored))
		trims = append(trims, droppedAlternatives(objs, stored)...)
		all = append(all, stored...)
		denials = append(denials, denied...)
	}
	for _, trim := range trims {
		d.out.printf("\nfirstAvailable alternatives the quota did not admit, dropped at creation: %s\n", trim)
	}
	for _, den := range denials {
		d.out.printf("\nDenied by quota, as the demo expects: %s %s/%s\n  %s\n", den.Object.GetKind(),
			den.Object.GetNamespace(), den.Object.GetName(), webhookReason(den.Message))
	}
	return all, nil
}

// applyCatalog applies the built-in catalog, demo/specs/00-catalog, before
// specs of one's own: specs copied from demo/specs name its DeviceClasses
// (gpu.gpuaas.io, ...), which neither node's controller creates. One's own
// specs are applied after it, so a class of the same name they define wins.
func (d *demo) applyCatalog(ctx context.Context) error {
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "demo", "specs", "00-catalog")
	files, err := framework.YAMLFiles(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, file := range files {
		objs, err := framework.ReadObjects(file)
		if err != nil {
			return err
		}
		stored, _, err := d.cp.ApplyObjects(ctx, file, objs, "default")
		if err != nil {
			return err
		}
		for _, o := range stored {
			names = append(names, o.GetName())
		}
	}
	d.out.printf("Applied the built-in catalog (demo/specs/00-catalog), which specs copied from demo/specs name: %s\n", strings.Join(names, ", "))
	return nil
}

// stop undoes what run started, newest first. It runs after ctx was
// cancelled (Ctrl-C), hence WithoutCancel.
func (d *demo) stop(ctx context.Context) error {
	if d.cp == nil {
		return nil
	}
	d.out.printf("Stopping ...\n")
	var errs []error
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if d.prom != nil {
		errs = append(errs, d.prom.Stop())
	}
	if d.sim != nil {
		errs = append(errs, d.sim.Stop(ctx))
	}
	if d.real != nil {
		errs = append(errs, d.stopRealNode(ctx))
	}
	if d.controller != nil {
		errs = append(errs, d.controller.Stop())
	}
	errs = append(errs, d.cp.Stop())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.out.printf("Stopped.\n")
	return nil
}

// startController builds and runs the dra-controller (catalog, quota
// webhook) against the control plane.
func (d *demo) startController(ctx context.Context) error {
	d.out.printf("Starting dra-controller (GPU catalog, quota admission webhook) ...\n")
	bin, err := framework.Build(ctx, d.cp.Dir, "cmd/dra-controller")
	if err != nil {
		return err
	}
	// Per tenant: the queueing scenario's dashboard step publishes the
	// catalog as HardwareProfiles once it installs their CRD.
	d.controller, err = d.cp.StartController(ctx, bin, "--kueue", "--hardware-profiles-per-tenant")
	return err
}

// useWorkload makes the specs' pods, bare or a controller's, run the
// gpuinfo workload on the real node, which prints what each container got
// (on the host network: the node has no pod network, so a pod of its own
// would never start).
func useWorkload(objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		var err error
		switch o.GetKind() {
		case "Pod":
			err = framework.UseWorkloadImage(o)
		case "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "ReplicationController", "Job":
			// All of these keep their pod template at spec.template, as a Job does.
			err = framework.UseWorkloadImageInJob(o)
		case "CronJob":
			// The Job template is edited in place: NoCopy shares its maps.
			tmpl, ok, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "jobTemplate")
			if m, isMap := tmpl.(map[string]any); ok && isMap {
				err = framework.UseWorkloadImageInJob(&unstructured.Unstructured{Object: m})
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// webhookReason keeps what the webhook said, without client-side framing.
func webhookReason(msg string) string {
	if _, after, ok := strings.Cut(msg, "denied the request: "); ok {
		return after
	}
	return msg
}
