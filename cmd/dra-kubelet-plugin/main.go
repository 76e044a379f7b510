// Command dra-kubelet-plugin is the node side of the gpu.gpuaas.io DRA
// driver: it publishes the node's GPUs and prepares them for containers.
// This file only parses flags and wires packages together.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/usage"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/cli"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceplugins"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/listen"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/coexist"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/maintenance"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
)

type flags struct {
	nodeName, kubeconfig, pluginDataDir, registrarDir  string
	cdiRoot, driverRoot, nvml, metricsAddr, healthAddr string
	hostDriverRoot                                     string
	podUID, cdiHookPath, nodeConfig, bootIDPath        string
	cdiHookSource                                      string
	nvmlHookSource                                     string
	mockStateDir                                       string
	clearFaults                                        string
	releaseGPUs, reacquireGPUs                         bool
	followUpgrades                                     bool
	mpsDaemons, mpsImage, podName, podNamespace        string
	priorityClass                                      string
	mpsShmSize                                         string
	devicePluginCoexistence, podResourcesSocket        string
	startTimeout, driverRetry, staticMIGResync         time.Duration
	devicePluginCheckInterval                          time.Duration
	usageInterval, usageWindow                         time.Duration
	procRoot                                           string
	// policies reads the idle policies (GpuProfiles, TenantQuotas); not a
	// flag: run sets it, nil makes every idle threshold 0.
	policies dynamic.Interface
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == mps.ExecInRootCommand {
		// An MPS daemon pod (pkg/mps): this process becomes the daemon.
		fmt.Fprintln(os.Stderr, mps.ExecInRoot(os.Args[2:]))
		os.Exit(1)
	}
	f := parseFlags()
	if f.clearFaults != "" {
		// An operator's request to the running plugin (kubectl exec).
		if err := health.RequestClear(healthClearDir(f), f.clearFaults); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("asked the plugin to clear the faults of %s at its next probe\n", f.clearFaults)
		return
	}
	if f.releaseGPUs || f.reacquireGPUs {
		// An operator's request to the running plugin (kubectl exec).
		os.Exit(requestMaintenance(f))
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	logger := klog.Background().WithName("dra-kubelet-plugin")
	ctx = klog.NewContext(ctx, logger)
	err := run(ctx, f)
	if errors.Is(err, nvdev.ErrNewProcessNeeded) && ctx.Err() == nil {
		cancel()
		reexec(logger, err)
	}
	if err != nil {
		logger.Error(err, "Plugin failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

// reexec replaces the process by a new run of the plugin, for a new
// driver whose NVML library this process cannot load (see
// nvdev.ErrNewProcessNeeded): the container goes on, without the restart
// and the back-off an exit would cost. Only if that fails does it exit.
func reexec(logger klog.Logger, reason error) {
	logger.Info("Executing the plugin again to load the new NVIDIA driver", "reason", reason.Error())
	klog.Flush()
	exe, err := os.Executable()
	if err == nil {
		err = syscall.Exec(exe, os.Args, os.Environ())
	}
	logger.Error(err, "Executing the plugin again failed; exiting so that the kubelet restarts it")
	klog.FlushAndExit(klog.ExitFlushTimeout, 1)
}

func parseFlags() flags {
	var f flags
	fs := pflag.CommandLine
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node; also the name of its device pool. [$NODE_NAME]")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "Kubeconfig file; empty means in-cluster configuration. [$KUBECONFIG]")
	fs.StringVar(&f.pluginDataDir, "plugin-data-dir", cli.Env("DRA_PLUGIN_DATA_DIR", "/var/lib/kubelet/plugins/gpu.gpuaas.io"), "Directory for the DRA socket (dra.sock) and the checkpoint of prepared claims. [$DRA_PLUGIN_DATA_DIR]")
	fs.StringVar(&f.registrarDir, "registrar-dir", cli.Env("DRA_REGISTRAR_DIR", "/var/lib/kubelet/plugins_registry"), "The kubelet's plugin registration directory. [$DRA_REGISTRAR_DIR]")
	fs.StringVar(&f.cdiRoot, "cdi-root", cli.Env("CDI_ROOT", "/var/run/cdi"), "Directory where per-claim CDI specs are written. [$CDI_ROOT]")
	fs.StringVar(&f.driverRoot, "driver-root", cli.Env("NVIDIA_DRIVER_ROOT", "/"), "Root of the NVIDIA driver installation (libraries, binaries, device nodes). [$NVIDIA_DRIVER_ROOT]")
	fs.StringVar(&f.hostDriverRoot, "host-driver-root", os.Getenv("NVIDIA_HOST_DRIVER_ROOT"), "The driver root as the container runtime on the host sees it, when --driver-root is where this process sees it (the chart mounts a host install, /, at /host). CDI specs name host paths. Empty: the same as --driver-root. [$NVIDIA_HOST_DRIVER_ROOT]")
	fs.StringVar(&f.cdiHookPath, "cdi-hook-path", os.Getenv("NVIDIA_CDI_HOOK_PATH"), fmt.Sprintf("Host path of nvidia-cdi-hook, which the container runtime runs to update a GPU container's ldcache and driver links (without it no container finds libcuda.so.1). Empty: install --cdi-hook-source into --plugin-data-dir and use that; %q: leave NVIDIA's hooks out of the specs. [$NVIDIA_CDI_HOOK_PATH]", cdi.HooksDisabled))
	fs.StringVar(&f.nvmlHookSource, "nvml-hook-source", cli.Env("NVIDIA_NVML_HOOK_SOURCE", cdi.DefaultNVMLHookSource), "The dynamically linked nvidia-cdi-hook shipped with the plugin (in its image), installed on the host with the image's loader and glibc to set devices' memory limits where the --cdi-hook-path binary is static (it cannot load NVML); empty: none. [$NVIDIA_NVML_HOOK_SOURCE]")
	fs.StringVar(&f.cdiHookSource, "cdi-hook-source", cli.Env("NVIDIA_CDI_HOOK_SOURCE", cdi.DefaultHookSource), "The nvidia-cdi-hook binary shipped with the plugin (in its image), installed on the host when --cdi-hook-path is empty. [$NVIDIA_CDI_HOOK_SOURCE]")
	fs.StringVar(&f.nvml, "nvml", cli.Env("NVML_BACKEND", nvdev.BackendReal), fmt.Sprintf("NVML backend: %q, or \"mock:<machine>\" with machine one of %v (simulated GPUs for demos and tests). [$NVML_BACKEND]", nvdev.BackendReal, nvmock.Machines()))
	fs.StringVar(&f.mockStateDir, "mock-nvml-state-dir", os.Getenv("MOCK_NVML_STATE_DIR"), "With a mock NVML backend: directory where the simulated machine's state (MIG mode, MIG devices, compute mode) is kept, one file per machine, so that it outlives the plugin process as a real GPU's does (restarts, rolling updates; hack/mocknvml simulates a reboot). Empty keeps it in the process's memory. [$MOCK_NVML_STATE_DIR]")
	fs.StringVar(&f.metricsAddr, "metrics-addr", cli.Env("METRICS_ADDR", ":8080"), "Address of the Prometheus /metrics endpoint; empty disables it. [$METRICS_ADDR]")
	fs.StringVar(&f.healthAddr, "healthcheck-addr", cli.Env("HEALTHCHECK_ADDR", ":51515"), "Address of the gRPC health service for liveness probes; empty disables it. [$HEALTHCHECK_ADDR]")
	fs.StringVar(&f.nodeConfig, "node-config", os.Getenv("NODE_CONFIG"), "Node configuration file (kind NodeConfig): how each GPU is offered (whole, MIG static or dynamic). Empty offers every GPU whole. [$NODE_CONFIG]")
	fs.StringVar(&f.bootIDPath, "boot-id-path", cli.Env("BOOT_ID_PATH", prepare.DefaultBootIDPath), "File holding the ID of the node's current boot; after a reboot the plugin makes again what prepared claims lost (MIG devices, sharing settings, CDI specs). A simulated node fakes its reboots here. [$BOOT_ID_PATH]")
	fs.StringVar(&f.clearFaults, "clear-faults", "", "Do not run: ask the plugin running on this node (same --plugin-data-dir) to clear the faults, and so the taints, of a GPU (its UUID, or \"all\") after an operator reset it; run with kubectl exec in the plugin pod.")
	fs.BoolVar(&f.releaseGPUs, "release-gpus", false, "Do not run: ask the plugin running on this node (same --plugin-data-dir) to let go of the GPUs for a GPU reset (nvidia-smi -r) or a driver upgrade (rmmod nvidia), and wait until it has: it shuts NVML down, taints its devices gpu.gpuaas.io/maintenance, refuses new claims and reports not ready, until --reacquire-gpus or a new driver version under --driver-root; run with kubectl exec in the plugin pod.")
	fs.BoolVar(&f.reacquireGPUs, "reacquire-gpus", false, "Do not run: ask the plugin running on this node to take the GPUs back after --release-gpus (it waits for the driver if it is not loaded yet), and wait until it has; run with kubectl exec in the plugin pod.")
	fs.StringVar(&f.podUID, "pod-uid", os.Getenv("POD_UID"), "UID of the plugin's pod; when set, enables rolling updates (two plugin pods on a node). [$POD_UID]")
	fs.StringVar(&f.mpsDaemons, "mps-daemons", cli.Env("MPS_DAEMONS", mpsInPods), fmt.Sprintf("Where MPS control daemons run: %q, a pod per GPU on this node (survives plugin restarts and rolling updates; needs --mps-daemon-image, $POD_NAME and $POD_NAMESPACE), or %q, background processes of the plugin (only where the plugin runs as a host process: in a container they die with it). [$MPS_DAEMONS]", mpsInPods, mpsInProcesses))
	fs.StringVar(&f.mpsImage, "mps-daemon-image", os.Getenv("MPS_DAEMON_IMAGE"), "Image of the MPS daemon pods (the plugin's own; the daemon binary comes from the driver root). [$MPS_DAEMON_IMAGE]")
	fs.StringVar(&f.priorityClass, "mps-daemon-priority-class", os.Getenv("MPS_DAEMON_PRIORITY_CLASS"), "Priority class of the MPS daemon pods. [$MPS_DAEMON_PRIORITY_CLASS]")
	fs.StringVar(&f.mpsShmSize, "mps-shm-size", cli.Env("MPS_SHM_SIZE", resource.NewQuantity(mps.DefaultShmSize, resource.BinarySI).String()), "With MPS daemons in pods: the size of each MPS GPU's shared memory, a tmpfs the daemon and every client see at /dev/shm (mounted in the plugin's directory, which must propagate to the host). [$MPS_SHM_SIZE]")
	fs.DurationVar(&f.startTimeout, "start-timeout", envDuration("START_TIMEOUT", plugin.DefaultStartTimeout), "How long one start step (opening NVML, restoring one prepared claim, registering) may take before the liveness check calls the start hung. Waiting for the driver is not a step: it lasts as long as the driver takes. [$START_TIMEOUT]")
	fs.DurationVar(&f.driverRetry, "driver-retry-interval", nvdev.DriverRetryInterval, "How often to look again for an NVIDIA driver that is not ready yet (no libnvidia-ml under --driver-root, or the kernel module not loaded); meanwhile the plugin is alive and not ready. Also how often the installed driver's version (libnvidia-ml.so.<version> under --driver-root) is read, so that a driver upgrade is taken up, and operators' --release-gpus requests.")
	fs.DurationVar(&f.staticMIGResync, "static-mig-resync", plugin.DefaultStaticMIGResync, "How often the MIG layouts of GPUs offered as static MIG are read again, so that MIG devices an admin (mig-manager) makes after the start are published, and every GPU's minor number, so that a GPU re-bound from outside the plugin (a MIG mode switch by mig-manager or an admin) is named by its new /dev/nvidiaN; negative: only at start.")
	fs.StringVar(&f.devicePluginCoexistence, "device-plugin-coexistence", cli.Env("DEVICE_PLUGIN_COEXISTENCE", string(coexist.CoexistenceStandDown)), fmt.Sprintf("What to do while a device plugin (NVIDIA's k8s-device-plugin, the GPU Operator's default) advertises this node's NVIDIA GPUs too (nvidia.com/gpu, nvidia.com/mig-*), as the kubelet's PodResources API reports: %q publishes no device at all; %q publishes only the GPUs none of whose IDs, replicas or MIG devices the device plugin advertises or a pod holds through it; %q does not look. Where the API cannot be read, every GPU is published until it answers, with a warning. [$DEVICE_PLUGIN_COEXISTENCE]", coexist.CoexistenceStandDown, coexist.CoexistenceExcludeOwned, coexist.CoexistenceOff))
	fs.StringVar(&f.podResourcesSocket, "pod-resources-socket", cli.Env("POD_RESOURCES_SOCKET", deviceplugins.DefaultSocket), "The kubelet's PodResources socket, asked which GPUs a device plugin hands out (see --device-plugin-coexistence). [$POD_RESOURCES_SOCKET]")
	fs.BoolVar(&f.followUpgrades, "follow-gpu-operator-upgrades", envBool("FOLLOW_GPU_OPERATOR_UPGRADES", true), "Follow the GPU Operator's driver upgrades on this node: while its label nvidia.com/gpu-driver-upgrade-state says pod-restart-required (the driver pod is restarted and unloads the kernel module), release the GPUs as --release-gpus does, and reacquire them when the label moves on (a new driver version starts the plugin again). Watches this node's labels (RBAC: list and watch nodes). [$FOLLOW_GPU_OPERATOR_UPGRADES]")
	fs.DurationVar(&f.devicePluginCheckInterval, "device-plugin-check-interval", envDuration("DEVICE_PLUGIN_CHECK_INTERVAL", coexist.DefaultDevicePluginCheckInterval), "How often the kubelet is asked again which GPUs a device plugin hands out (one is installed or removed during a migration); negative: only at start. [$DEVICE_PLUGIN_CHECK_INTERVAL]")
	fs.DurationVar(&f.usageInterval, "usage-interval", envDuration("USAGE_INTERVAL", usage.DefaultInterval), "How often the use of each prepared device is sampled through NVML (utilization, memory; per process on shared GPUs), and the use Lease renewed; negative: never (no Idle condition, no Lease). [$USAGE_INTERVAL]")
	fs.DurationVar(&f.usageWindow, "usage-window", envDuration("USAGE_WINDOW", usage.DefaultWindow), "Length of the windows a device's use is judged in: idle when every sample of a window is at most the claim's idle threshold. [$USAGE_WINDOW]")
	fs.StringVar(&f.procRoot, "proc-root", cli.Env("PROC_ROOT", usage.DefaultProcRoot), "Where the host's /proc is seen: a shared GPU's processes are mapped to pods through <proc-root>/<pid>/cgroup (the chart runs the plugin in the host's PID namespace). [$PROC_ROOT]")
	f.podName, f.podNamespace = os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	cli.Parse(fs, "dra-kubelet-plugin publishes this node's NVIDIA GPUs to Kubernetes (driver gpu.gpuaas.io)\nand prepares allocated GPUs for containers through CDI.")
	return f
}

func run(ctx context.Context, f flags) error {
	if f.nodeName == "" {
		return errors.New("--node-name (or $NODE_NAME) is required")
	}
	cfg, err := restConfig(f.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating Kubernetes client: %w", err)
	}
	// JSON (dynamic.ConfigFor): custom resources have no protobuf.
	if f.policies, err = dynamic.NewForConfig(cfg); err != nil {
		return fmt.Errorf("creating Kubernetes client for idle policies: %w", err)
	}
	return runWith(ctx, f, client)
}

// runWith starts the plugin and serves until ctx ends. The health and
// metrics endpoints come first: a start may wait for the driver, or take
// minutes restoring prepared claims after a reboot, and the probes must
// see that it is alive (and why it is not ready yet) meanwhile, rather
// than a closed port that gets the container killed part-way.
func runWith(ctx context.Context, f flags, client kubernetes.Interface) error {
	nodeCfg, err := readNodeConfig(f.nodeConfig)
	if err != nil {
		return err
	}
	coexistence, err := coexist.ParseCoexistence(f.devicePluginCoexistence)
	if err != nil {
		return fmt.Errorf("--device-plugin-coexistence: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	health := plugin.NewHealth(f.startTimeout)
	defer health.Stop()
	if err := serveAuxiliary(ctx, f, reg, health); err != nil {
		return err
	}
	health.Step(ctx, "opening NVML")
	opened, err := openNVML(ctx, f, health)
	if err != nil && ctx.Err() != nil {
		klog.FromContext(ctx).Info("Shutting down while waiting for the NVIDIA driver")
		return nil
	}
	if err != nil {
		return err
	}
	// Releasable: an operator lets go of the GPUs for a reset or an
	// upgrade without stopping the plugin (--release-gpus).
	lib := nvdev.NewReleasable(opened, nvmlOptions(f))
	defer func() { _ = lib.Shutdown() }()
	// A driver upgrade that needs a new process ends the run with its
	// reason (main executes the plugin again).
	ctx, restart := context.WithCancelCause(ctx)
	defer restart(nil)
	health.Step(ctx, "setting up CDI")
	cdiHandler, err := cdi.NewHandler(cdi.Options{
		CDIRoot: f.cdiRoot, DriverRoot: f.driverRoot, HostDriverRoot: f.hostDriverRoot, NVML: lib.NVML(),
		CDIHookPath: cdiHookPath(ctx, f), NVMLHook: nvmlHook(ctx, f), Logger: klog.FromContext(ctx),
	})
	if err != nil {
		return fmt.Errorf("setting up CDI: %w", err)
	}
	// The plugin runs the monitor: it stops it while the GPUs are
	// released (its event set holds the driver).
	monitor := healthMonitor(nodeCfg.Health, lib, reg, f)
	// Warnings an operator must act on go to the Node's events.
	broadcaster := events.NewEventBroadcasterAdapterWithContext(ctx, client)
	broadcaster.StartRecordingToSink(ctx.Done())
	defer broadcaster.Shutdown()
	mpsLauncher, err := newMPSLauncher(ctx, f, client)
	if err != nil {
		return err
	}
	mpsShm, err := newMPSShm(f)
	if err != nil {
		return err
	}
	driver, err := plugin.Start(ctx, plugin.Options{
		NodeName: f.nodeName, KubeClient: client, NVML: lib, CDI: cdiHandler, NodeConfig: nodeCfg,
		DriverRoot: f.driverRoot, BootIDPath: f.bootIDPath, MPSLauncher: mpsLauncher, MPSShm: mpsShm,
		Events:        broadcaster.NewRecorder("gpuaas-dra-kubelet-plugin"),
		PluginDataDir: f.pluginDataDir, RegistrarDir: f.registrarDir,
		PodUID: types.UID(f.podUID), Metrics: telemetry.NewMetrics(reg), Health: monitor, Steps: health,
		StaticMIGResync: f.staticMIGResync,
		Maintenance: maintenance.Options{Session: lib, Files: cdiHandler, Dir: maintenance.Dir(f.pluginDataDir),
			DriverRoot: f.driverRoot, Interval: f.driverRetry, RunHealth: true, Restart: restart,
			UpgradeState: upgradeState(ctx, f, client)},
		DevicePlugins: coexist.DevicePluginCheck{Coexistence: coexistence, Socket: f.podResourcesSocket,
			Interval: f.devicePluginCheckInterval},
		Usage: usageOptions(ctx, f, reg),
	})
	if err != nil {
		return err
	}
	defer driver.Stop()
	health.Started(driver)
	<-ctx.Done()
	if cause := context.Cause(ctx); errors.Is(cause, nvdev.ErrNewProcessNeeded) {
		klog.FromContext(ctx).Info("Stopping to start again in a new process", "reason", cause.Error())
		return cause
	}
	klog.FromContext(ctx).Info("Shutting down")
	return nil
}

// usageOptions configure the use sampler: its thresholds from the idle
// policies and its tenants from the TenantQuotas, its metrics, and the Lease in the plugin's namespace held by
// this process (pod and PID), acquired at its start.
func usageOptions(ctx context.Context, f flags, reg prometheus.Registerer) plugin.UsageOptions {
	opts := plugin.UsageOptions{Interval: f.usageInterval, Window: f.usageWindow, ProcRoot: f.procRoot,
		Namespace: f.podNamespace, Started: time.Now()}
	if f.usageInterval < 0 {
		return opts
	}
	opts.Metrics = usage.NewMetrics(reg)
	policies := usage.WatchPolicies(ctx, f.policies, time.Minute)
	opts.Thresholds, opts.Tenants = policies, policies
	holder := f.podName
	if holder == "" {
		holder, _ = os.Hostname()
	}
	opts.Holder = fmt.Sprintf("%s_%d", holder, os.Getpid())
	return opts
}

// nvmlOptions open the NVML session of the flags' backend.
func nvmlOptions(f flags) nvdev.Options {
	return nvdev.Options{Backend: f.nvml, DriverRoot: f.driverRoot, MockSeed: f.nodeName, MockStateDir: f.mockStateDir}
}

// openNVML opens the NVML session, waiting while the driver is not there
// yet (the GPU Operator's driver container installs it under
// /run/nvidia/driver minutes after boot): not ready, and saying what it
// waits for, instead of exiting into a crash loop whose back-off delays
// the start long after the driver is ready.
func openNVML(ctx context.Context, f flags, health *plugin.Health) (nvdev.Interface, error) {
	logger := klog.FromContext(ctx)
	var tries int
	lib, err := nvdev.OpenWhenReady(ctx, nvmlOptions(f), f.driverRetry, func(err error) {
		what := fmt.Sprintf("waiting for the NVIDIA driver under driver root %s", f.driverRoot)
		health.Wait(ctx, what)
		// Once, then every minute or so: the wait can last long.
		if tries%max(1, int(time.Minute/max(f.driverRetry, time.Second))) == 0 {
			logger.Info("NVIDIA driver not ready; waiting (not ready until it is)", "driverRoot", f.driverRoot, "reason", err.Error())
		}
		tries++
	})
	if err != nil {
		return nil, fmt.Errorf("opening NVML: %w", err)
	}
	if tries > 0 {
		logger.Info("NVIDIA driver ready", "driverRoot", f.driverRoot, "tries", tries)
	}
	return lib, nil
}

// cdiHookPath is the hook the CDI specs name: the configured one, or the
// plugin's own installed on the host. Without one, cdi.NewHandler refuses
// to start where a driver is installed, with the reason.
func cdiHookPath(ctx context.Context, f flags) string {
	if f.cdiHookPath != "" {
		return f.cdiHookPath
	}
	path, err := cdi.InstallHook(f.cdiHookSource, f.pluginDataDir)
	if err != nil {
		klog.FromContext(ctx).Info("No nvidia-cdi-hook installed: GPU containers get no ldcache update", "err", err)
		return ""
	}
	klog.FromContext(ctx).V(1).Info("Installed nvidia-cdi-hook for the container runtime", "path", path)
	return path
}

// nvmlHook installs the image's dynamic hook, its loader and glibc on the
// host for the memory-limit hook. Without it memory limits are written
// only where --cdi-hook-path is a dynamic hook (cdi.MemoryLimits says why).
func nvmlHook(ctx context.Context, f flags) cdi.NVMLHook {
	if f.nvmlHookSource == "" || f.cdiHookPath == cdi.HooksDisabled {
		return cdi.NVMLHook{}
	}
	h, err := cdi.InstallNVMLHook(f.nvmlHookSource, f.pluginDataDir)
	if err != nil {
		klog.FromContext(ctx).Info("No NVML hook installed: memory limits only with a dynamically linked --cdi-hook-path", "err", err)
		return cdi.NVMLHook{}
	}
	klog.FromContext(ctx).V(1).Info("Installed the NVML hook for the container runtime", "path", h.Binary, "loader", h.Loader)
	return h
}

// serveAuxiliary starts the metrics and health endpoints; they stop with
// the process. On the host network during a rolling update the old pod
// still holds the ports: they are taken over when it leaves.
func serveAuxiliary(ctx context.Context, f flags, reg *prometheus.Registry, health *plugin.Health) error {
	if f.healthAddr != "" {
		if err := listen.WhenFree(ctx, "health", f.healthAddr, func(l net.Listener) { health.Serve(ctx, l) }); err != nil {
			return err
		}
	}
	if f.metricsAddr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return listen.WhenFree(ctx, "metrics", f.metricsAddr, func(l net.Listener) {
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.FromContext(ctx).Error(err, "Metrics server stopped")
			}
		}()
	})
}

// envDuration is a flag's default from the environment; one that does not
// parse stops the plugin with the reason, never a silent default.
func envDuration(name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "$%s=%q is not a duration (e.g. 10m): %v\n", name, v, err)
		os.Exit(2)
	}
	return d
}

func envBool(name string, def bool) bool {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "$%s=%q is not true or false: %v\n", name, v, err)
		os.Exit(2)
	}
	return b
}

// upgradeState follows the node's GPU Operator upgrade state where asked.
func upgradeState(ctx context.Context, f flags, client kubernetes.Interface) func() string {
	if !f.followUpgrades {
		return nil
	}
	return maintenance.WatchUpgradeState(ctx, client, f.nodeName)
}

// The plugin's API client rate: the kubelet's own defaults, and on top of
// its burst the start's GETs of its prepared claims (prepare.MaxClaimGets).
// client-go's (5 QPS, burst 10) put every prepare behind the limiter once
// claims come faster than 2.5 a second (the helper's GET of the claim and
// our status.devices apply take a token each), and made a restart with 100
// prepared claims wait 19 s for the check that each still exists.
const (
	clientQPS   = 50
	clientBurst = 100 + prepare.MaxClaimGets
)

func restConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading Kubernetes client configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = clientQPS, clientBurst
	// Protobuf, as the kubelet speaks: the start's GETs of its prepared
	// claims and every prepare's GET of its claim are on the first
	// prepare's path after a restart, and decoding JSON cost the most of
	// each. Every object this client reads or writes is a built-in type.
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return cfg, nil
}

// readNodeConfig reads and strictly decodes the node configuration; a bad
// file stops the plugin at start with the reason, never a silent default.
func readNodeConfig(path string) (*configapi.NodeConfig, error) {
	if path == "" {
		return &configapi.NodeConfig{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading node configuration: %w", err)
	}
	cfg, err := configapi.DecodeNodeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// healthMonitor builds the GPU health monitor the node configuration asks
// for; nil when it is disabled.
func healthMonitor(cfg *configapi.HealthConfig, lib nvdev.Interface, reg prometheus.Registerer, f flags) *health.Monitor {
	if cfg == nil {
		cfg = &configapi.HealthConfig{}
	}
	if cfg.Disabled {
		return nil
	}
	var mc health.Config
	if cfg.ProbeInterval != nil {
		mc.ProbeInterval = cfg.ProbeInterval.Duration
	}
	if cfg.XIDQuietPeriod != nil {
		mc.QuietPeriod = cfg.XIDQuietPeriod.Duration
	}
	mc.NoExecute = cfg.NoExecute
	// Faults are kept beside the checkpoint for the rest of the boot.
	mc.StatePath = filepath.Join(f.pluginDataDir, "health.json")
	mc.ClearDir = healthClearDir(f)
	if id, err := os.ReadFile(f.bootIDPath); err == nil {
		mc.BootID = strings.TrimSpace(string(id))
	}
	return health.New(lib, mc, health.NewMetrics(reg))
}

// healthClearDir is where operators' requests to clear faults go.
func healthClearDir(f flags) string { return filepath.Join(f.pluginDataDir, "health-clear") }

const (
	mpsInPods      = "pod"
	mpsInProcesses = "process"
)

// newMPSShm is each MPS GPU's shared memory: a sized tmpfs where daemons
// run in pods (shared with every client); daemons run as processes share
// none.
func newMPSShm(f flags) (mps.ShmMounter, error) {
	if f.mpsDaemons != mpsInPods {
		return nil, nil
	}
	size, err := resource.ParseQuantity(f.mpsShmSize)
	if err != nil {
		return nil, fmt.Errorf("--mps-shm-size=%q: %w", f.mpsShmSize, err)
	}
	if size.Value() < 1<<20 {
		return nil, fmt.Errorf("--mps-shm-size=%q: want at least 1Mi", f.mpsShmSize)
	}
	return mps.Tmpfs{Size: size.Value()}, nil
}

// newMPSLauncher picks where MPS daemons run. The pods belong to the
// plugin's DaemonSet, read from the plugin's own pod.
func newMPSLauncher(ctx context.Context, f flags, client kubernetes.Interface) (mps.Launcher, error) {
	switch f.mpsDaemons {
	case mpsInProcesses:
		return nil, nil
	case mpsInPods:
	default:
		return nil, fmt.Errorf("--mps-daemons=%q: want %q or %q", f.mpsDaemons, mpsInPods, mpsInProcesses)
	}
	l := &mps.PodLauncher{Client: client, Namespace: f.podNamespace, NodeName: f.nodeName, Image: f.mpsImage,
		DriverRoot: f.driverRoot, HostDriverRoot: f.hostDriverRoot, PriorityClassName: f.priorityClass}
	if f.podName != "" && f.podNamespace != "" {
		owner, err := mps.OwnerOf(ctx, client, f.podNamespace, f.podName)
		if err != nil {
			return nil, err
		}
		l.Owner = owner
	}
	return l, nil
}
