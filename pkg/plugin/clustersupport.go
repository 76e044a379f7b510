package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
	"k8s.io/klog/v2"
)

// What the cluster keeps of the slices (issue 35). Kubernetes 1.34 to 1.37
// differ, and a field behind a disabled gate is dropped silently: a dynamic
// MIG GPU published with its counters dropped is a whole GPU and its MIG
// devices that the scheduler hands out to different claims at once. So the
// plugin asks the API server (sliceprobe) before its first publish and
// publishes only what is kept; no unsafe slice is ever stored, not even for
// a moment after a restart. It asks again when the API server's version
// changes, and every ClusterProbeInterval*12 in case only its gates did.

const (
	// supportFile keeps the last answer, for a start that cannot ask.
	supportFile = "cluster-support.json"
	// DefaultClusterProbeInterval is how often the API server's version is
	// compared; every twelfth time the whole probe runs again.
	DefaultClusterProbeInterval = 5 * time.Minute
	// reprobeEvery is how many version checks pass between full probes.
	reprobeEvery = 12
)

// clusterProbe asks and remembers; nil prober: no client, Full assumed.
type clusterProbe struct {
	prober   *sliceprobe.Prober
	path     string
	interval time.Duration
	// probed: the current support came from an answer, not an assumption.
	probed bool
}

func newClusterProbe(opts Options) *clusterProbe {
	cp := &clusterProbe{path: filepath.Join(opts.PluginDataDir, supportFile), interval: opts.ClusterProbeInterval}
	if cp.interval == 0 {
		cp.interval = DefaultClusterProbeInterval
	}
	if opts.KubeClient != nil {
		cp.prober = &sliceprobe.Prober{Client: opts.KubeClient, Node: opts.NodeName, Driver: configapi.DriverName}
	}
	return cp
}

// ask probes; when the API server cannot be asked it falls back on the
// last answer on disk, else on the least the API server's version keeps
// whatever its gates (sliceprobe's Floor: from 1.38 counters and taints are
// locked on), else on the least any supported version keeps (fail closed:
// less offered, nothing offered twice).
func (cp *clusterProbe) ask(ctx context.Context) sliceprobe.Support {
	if cp.prober == nil {
		cp.probed = true
		return sliceprobe.Full
	}
	s, err := cp.prober.Probe(ctx)
	if err == nil {
		cp.probed = true
		if err := cp.save(s); err != nil {
			klog.FromContext(ctx).Error(err, "Keeping what the cluster keeps of the slices")
		}
		return s
	}
	cp.probed = false
	last, lerr := cp.load()
	if lerr != nil {
		last = cp.prober.Floor()
	}
	klog.FromContext(ctx).Error(err, "Could not ask the API server what it keeps of the slices; publishing what the last answer allows until it answers",
		"assumed", last.String(), "lastAnswer", lerr == nil)
	return last
}

func (cp *clusterProbe) save(s sliceprobe.Support) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", cp.path, err)
	}
	tmp := cp.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, cp.path); err != nil {
		return fmt.Errorf("replacing %s: %w", cp.path, err)
	}
	return nil
}

func (cp *clusterProbe) load() (sliceprobe.Support, error) {
	var s sliceprobe.Support
	b, err := os.ReadFile(cp.path)
	if err != nil {
		return s, fmt.Errorf("reading %s: %w", cp.path, err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("decoding %s: %w", cp.path, err)
	}
	return s, nil
}

// changed tells whether it is time to probe again: the last probe failed,
// the API server's version is not the one probed, or reprobeEvery checks
// have passed.
func (cp *clusterProbe) changed(tick int, current sliceprobe.Support) bool {
	if !cp.probed || tick%reprobeEvery == 0 {
		return true
	}
	v, err := cp.prober.Client.Discovery().ServerVersion()
	return err == nil && v.GitVersion != current.ServerVersion
}

// learnClusterSupport asks before the first publish and reports the gaps.
func (d *Driver) learnClusterSupport(ctx context.Context, cp *clusterProbe) {
	s := cp.ask(ctx)
	d.mu.Lock()
	d.support = &s
	d.mu.Unlock()
	d.reportSupport(ctx, s)
}

// clusterSupport is what the cluster keeps; the caller holds d.mu.
func (d *Driver) clusterSupport() sliceprobe.Support {
	if d.support == nil {
		return sliceprobe.Full
	}
	return *d.support
}

// watchClusterSupport asks again from time to time, and republishes in the
// new shape when the answer changes.
func (d *Driver) watchClusterSupport(ctx context.Context, cp *clusterProbe) {
	if cp.prober == nil || cp.interval < 0 {
		return
	}
	go func() {
		ticker := time.NewTicker(cp.interval)
		defer ticker.Stop()
		for tick := 1; ; tick++ {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			d.mu.Lock()
			current := d.clusterSupport()
			d.mu.Unlock()
			if !cp.changed(tick, current) {
				continue
			}
			s := cp.ask(ctx)
			reshaped := !sameShape(s, current)
			d.mu.Lock()
			d.support = &s // the version, at least, is the one now probed
			var err error
			if reshaped {
				err = d.publishLocked(ctx)
			}
			d.mu.Unlock()
			if !reshaped {
				continue
			}
			d.reportSupport(ctx, s)
			if err != nil {
				klog.FromContext(ctx).Error(err, "Republishing in the shape the cluster now keeps")
			}
		}
	}()
}

// sameShape: a and b publish the same slices (the version alone differs).
func sameShape(a, b sliceprobe.Support) bool {
	a.ServerVersion, b.ServerVersion = "", ""
	return a == b
}

// reportSupport logs what the cluster keeps, and each gap as an error, a
// Warning event on the Node and a metric.
func (d *Driver) reportSupport(ctx context.Context, s sliceprobe.Support) {
	logger := klog.FromContext(ctx)
	logger.Info("What the cluster keeps of the slices", "apiServer", s.ServerVersion, "counters", s.Counters,
		"taints", s.Taints, "taintEffectNone", s.TaintEffectNone, "maxTaints", s.MaxTaints, "consumableCapacity", s.ConsumableCapacity)
	gaps := s.Gaps()
	d.metrics.SetClusterGaps(gaps)
	for _, g := range gaps {
		logger.Error(nil, "The cluster lacks a feature the plugin publishes; publishing less", "feature", g.Feature, "gate", g.Gate, "instead", g.Effect)
		d.events.Warn(telemetry.ReasonClusterFeatureMissing, "PublishResources",
			"The API server lacks %s: %s. Enable the feature gate %s if this Kubernetes version has it (docs/install.md).", g.Feature, g.Effect, g.Gate)
	}
}
