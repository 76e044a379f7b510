// Package framework runs a real Kubernetes control plane (etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager) from binaries on
// 127.0.0.1 for the e2e tests and the demo, plus the helpers the tests need:
// namespaces, applying YAML, waiting for pods, and simulated GPU nodes (the
// DRA plugin binary with an in-process kubelet simulator).
//
// Nothing is faked on the control-plane side: the scheduler's DRA allocator
// places claims, the resourceclaim controller creates claims from templates,
// the namespace controller deletes what a test leaves behind.
package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// startTimeout bounds the whole start-up; on an idle 2-core machine it takes
// about 4 s, under load much longer.
const startTimeout = 3 * time.Minute

// Options configure Start. Zero values are fine.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-scheduler,
	// kube-controller-manager (and kubectl). Default: DefaultBinDir().
	BinDir string
	// Dir receives data, certificates, logs and the kubeconfig. Default: a
	// new temporary directory.
	Dir string
	// Verbosity is the -v of the scheduler and the controller-manager.
	Verbosity int
	// Progress receives one line per milestone; nil means io.Discard.
	Progress io.Writer
	// ClientQPS, when set, is the API client rate (QPS, burst twice that)
	// of the scheduler and the controller-manager, raised for the scale
	// benchmark so that it measures their work, not their client-side
	// throttling (upstream's scheduler_perf does the same). Zero keeps the
	// scheduler's default of 50 and the controller-manager's 200.
	ClientQPS int
	// VersionBinDir holds the kube-apiserver, kube-scheduler and
	// kube-controller-manager (and the kubelet, for a real node) of another
	// Kubernetes version, built by hack/build-k8s-version.sh; they replace
	// BinDir's. Empty: BinDir's own version.
	VersionBinDir string
	// KubeletBinDir, when set, holds the real node's kubelet instead: a
	// version skew, the control plane upgraded before its kubelets, as an
	// upgrade runs (and as the next minor runs here while the proxy refuses
	// what its kubelet imports). Empty: VersionBinDir's, else BinDir's.
	KubeletBinDir string
	// FeatureGates is the --feature-gates of the API server, the scheduler,
	// the controller-manager and a real node's kubelet: every component
	// reads the same gate list, and a gate on in one and off in another
	// (the scheduler ignoring counters the API server keeps) is a cluster
	// no admin runs. Empty: each version's defaults.
	FeatureGates string
	// RuntimeConfig is the API server's --runtime-config: the API versions
	// a gate needs served that are off by default (DeviceTaintRule's
	// resource.k8s.io/v1alpha3 on 1.34). Empty: the version's defaults.
	RuntimeConfig string
	// APIServerOnly starts etcd and the API server alone: no scheduler and
	// no controller-manager, for tests of what the API server keeps.
	APIServerOnly bool
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	// Dir holds everything the control plane wrote; LogDir the logs.
	Dir, LogDir string
	// Kubeconfig is an admin kubeconfig file for other processes.
	Kubeconfig string
	// BinDir is where the binaries came from (kubectl is there too).
	BinDir string
	// VersionBinDir, when set, is where the Kubernetes components of
	// another version came from (Options.VersionBinDir).
	VersionBinDir string
	// kubeletBinDir is Options.KubeletBinDir.
	kubeletBinDir string
	// FeatureGates is every component's --feature-gates (Options).
	FeatureGates string
	Config       *rest.Config
	Client       kubernetes.Interface
	Dynamic      dynamic.Interface

	mapper *restmapper.DeferredDiscoveryRESTMapper
	// schedulerURL is the scheduler's secure endpoint (SchedulerProfile).
	schedulerURL string
	procs        []*Process // in start order
	// nodeCount numbers the nodes' directories.
	nodeCount atomic.Int32
	// apiServerOnly: no scheduler nor controller-manager runs.
	apiServerOnly bool
	progress      io.Writer
}

// component is one control-plane process and how to tell it is healthy.
type component struct {
	name      string
	args      []string
	healthURL string
}

// Start brings up the control plane and waits until pods can be created in
// the default namespace. On error, whatever was started is stopped again;
// the ControlPlane returned with the error, when not nil, tells where the
// logs are.
func Start(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	cp, err = newControlPlane(opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = cp.Stop() // the start error says more
		}
	}()
	begin := time.Now()
	if err := cp.start(ctx, opts); err != nil {
		return cp, err
	}
	cp.logf("control plane ready in %.1fs (logs: %s)", time.Since(begin).Seconds(), cp.LogDir)
	return cp, nil
}

func newControlPlane(opts Options) (*ControlPlane, error) {
	if opts.BinDir == "" {
		dir, err := DefaultBinDir()
		if err != nil {
			return nil, err
		}
		opts.BinDir = dir
	}
	if missing := MissingBinaries(opts.BinDir); len(missing) > 0 {
		return nil, fmt.Errorf("control-plane binaries %v not found in %s", missing, opts.BinDir)
	}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "gpuaas-e2e-")
		if err != nil {
			return nil, fmt.Errorf("creating work dir: %w", err)
		}
		opts.Dir = dir
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.VersionBinDir != "" {
		need := []string{"kube-apiserver", "kube-scheduler", "kube-controller-manager"}
		if opts.APIServerOnly {
			need = need[:1]
		}
		for _, name := range need {
			if _, err := os.Stat(filepath.Join(opts.VersionBinDir, name)); err != nil {
				return nil, fmt.Errorf("%s of another version (hack/build-k8s-version.sh): %w", name, err)
			}
		}
	}
	cp := &ControlPlane{Dir: opts.Dir, LogDir: filepath.Join(opts.Dir, "logs"), BinDir: opts.BinDir,
		VersionBinDir: opts.VersionBinDir, kubeletBinDir: opts.KubeletBinDir, FeatureGates: opts.FeatureGates, progress: opts.Progress}
	if err := os.MkdirAll(cp.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating log dir: %w", err)
	}
	return cp, nil
}

func (cp *ControlPlane) start(ctx context.Context, opts Options) error {
	ports, err := FreePorts(5)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort, schedPort, kcmPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	saKey, saPub, err := writeServiceAccountKey(cp.Dir)
	if err != nil {
		return err
	}
	tokens, token, err := writeTokenFile(cp.Dir)
	if err != nil {
		return err
	}
	if err := cp.run(ctx, cp.etcd(etcdPort, peerPort), ""); err != nil {
		return err
	}
	api := cp.apiserver(apiPort, etcdPort, saKey, saPub, tokens)
	if opts.RuntimeConfig != "" {
		api.args = append(api.args, "--runtime-config", opts.RuntimeConfig)
	}
	if err := cp.run(ctx, api, token); err != nil {
		return err
	}
	if err := cp.connect(apiPort, token); err != nil {
		return err
	}
	if opts.APIServerOnly {
		cp.apiServerOnly = true
		return nil
	}
	cp.schedulerURL = fmt.Sprintf("https://127.0.0.1:%d", schedPort)
	if err := cp.run(ctx, cp.scheduler(schedPort, opts.Verbosity, opts.ClientQPS), ""); err != nil {
		return err
	}
	if err := cp.run(ctx, cp.controllerManager(kcmPort, opts.Verbosity, opts.ClientQPS, saKey), ""); err != nil {
		return err
	}
	return WaitForServiceAccount(ctx, cp.Client, "default")
}

// run starts one component and waits until its health endpoint answers.
func (cp *ControlPlane) run(ctx context.Context, c component, token string) error {
	proc := NewProcess(c.name, cp.kubernetesBinary(c.name), filepath.Join(cp.LogDir, c.name+".log"), cp.withGates(c.name, c.args)...)
	if err := proc.Start(); err != nil {
		return err
	}
	cp.procs = append(cp.procs, proc)
	if err := waitHealthy(ctx, proc, c.healthURL, token); err != nil {
		return err
	}
	cp.logf("%s healthy", c.name)
	return nil
}

// kubernetesBinary is the executable of a Kubernetes component: the other
// version's where the control plane runs one (VersionBinDir), else
// BinDir's; the kubelet KubeletBinDir's where that is set. etcd and
// kubectl always come from BinDir.
func (cp *ControlPlane) kubernetesBinary(name string) string {
	if name == "kubelet" && cp.kubeletBinDir != "" {
		return filepath.Join(cp.kubeletBinDir, name)
	}
	switch name {
	case "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet":
		if cp.VersionBinDir != "" {
			return filepath.Join(cp.VersionBinDir, name)
		}
	}
	return filepath.Join(cp.BinDir, name)
}

// withGates appends the control plane's feature gates to a Kubernetes
// component's arguments (etcd has none).
func (cp *ControlPlane) withGates(name string, args []string) []string {
	if cp.FeatureGates == "" || name == "etcd" {
		return args
	}
	return append(args, "--feature-gates", cp.FeatureGates)
}

// connect writes the kubeconfig and creates the clients once the apiserver
// is ready; the scheduler and controller-manager read that kubeconfig.
func (cp *ControlPlane) connect(apiPort int, token string) error {
	cp.Config = restConfig(apiPort, token)
	cp.Kubeconfig = filepath.Join(cp.Dir, "kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.Config); err != nil {
		return err
	}
	var err error
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	if cp.Dynamic, err = dynamic.NewForConfig(cp.Config); err != nil {
		return fmt.Errorf("creating dynamic client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		return fmt.Errorf("creating discovery client: %w", err)
	}
	cp.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	return nil
}

// Stop ends all components, newest first, and waits for them. The work dir
// (with the logs) is kept; Cleanup removes it. The error names components
// that had died before.
func (cp *ControlPlane) Stop() error {
	var errs []error
	for i := len(cp.procs) - 1; i >= 0; i-- {
		errs = append(errs, cp.procs[i].Stop())
	}
	cp.procs = nil
	return errors.Join(errs...)
}

// Cleanup removes the work dir. Call it after Stop, and only when the logs
// are no longer wanted.
func (cp *ControlPlane) Cleanup() error {
	if err := os.RemoveAll(cp.Dir); err != nil {
		return fmt.Errorf("removing %s: %w", cp.Dir, err)
	}
	return nil
}

// Processes returns the running control-plane processes.
func (cp *ControlPlane) Processes() []*Process {
	return append([]*Process(nil), cp.procs...)
}

func (cp *ControlPlane) logf(format string, args ...any) {
	_, _ = fmt.Fprintf(cp.progress, "e2e: "+format+"\n", args...)
}
