// Command writtenobjects writes what the project writes to the API server,
// one JSON file an object, into a directory: the plugin's ResourceSlices for
// each node configuration on each simulated machine, healthy and with a
// fault of every kind tainting its GPUs; the DeviceClasses the demo's
// GpuProfiles render; and the ResourceClaimTemplates the demo's GpuShapes
// render. hack/validate-next validates each with the next Kubernetes
// minor's own validation (issue 57; make validate-next).
//
//	go run ./hack/writtenobjects -out DIR
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock: backends
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
)

// machines are the simulated machines whose slices are written.
var machines = []string{"dgxh100", "dgxa100"}

// nodeConfigs are the node configurations whose slices are written: the
// default (whole GPUs), the demo's (every mode side by side), and every GPU
// in dynamic MIG (the most devices and counters a node publishes).
var nodeConfigs = map[string]string{
	"whole":       "",
	"demo":        "demo/node-config.yaml",
	"dynamic-mig": "",
}

// faultKinds taint a GPU each, in the slices "with faults".
var faultKinds = []string{health.KindXID, health.KindECC, health.KindRowRemap, health.KindGPULost,
	health.KindCleanupBlocked, health.KindUnmonitored}

func main() {
	out := flag.String("out", "", "directory to write the objects into (created)")
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := run(*root, *out); err != nil {
		fmt.Fprintln(os.Stderr, "writtenobjects:", err)
		os.Exit(1)
	}
}

func run(root, out string) error {
	if out == "" {
		return errors.New("-out is required")
	}
	if err := os.MkdirAll(out, 0o750); err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	n := 0
	for _, m := range machines {
		for name, path := range nodeConfigs {
			cfg, err := nodeConfig(root, name, path)
			if err != nil {
				return err
			}
			written, err := writeSlices(out, m, name, cfg)
			if err != nil {
				return err
			}
			n += written
		}
	}
	written, err := writeCatalog(root, out)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %d objects into %s\n", n+written, out)
	return nil
}

func nodeConfig(root, name, path string) (*configapi.NodeConfig, error) {
	switch {
	case name == "dynamic-mig":
		return &configapi.NodeConfig{Default: configapi.GpuMode{MIG: configapi.MigDynamic}}, nil
	case path == "":
		return &configapi.NodeConfig{}, nil
	}
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return nil, fmt.Errorf("reading node configuration: %w", err)
	}
	cfg, err := configapi.DecodeNodeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// writeSlices writes the slices the plugin publishes for cfg on machine, as
// the newest Kubernetes keeps them (sliceprobe.Full), healthy and with
// faults.
func writeSlices(out, machine, name string, cfg *configapi.NodeConfig) (int, error) {
	state, err := os.MkdirTemp("", "writtenobjects-")
	if err != nil {
		return 0, fmt.Errorf("creating the mock machine's state directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(state) }()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + machine, MockSeed: "node-a", MockStateDir: state})
	if err != nil {
		return 0, fmt.Errorf("opening mock machine %s: %w", machine, err)
	}
	defer func() { _ = lib.Shutdown() }()
	inv := inventory.Discover(klog.Background(), lib, cfg).ForCluster(sliceprobe.Full)
	var faults []health.Fault
	for i, gpu := range lib.GPUs() {
		kind := faultKinds[i%len(faultKinds)]
		faults = append(faults, health.Fault{Kind: kind, Value: "written-objects", GPU: gpu.UUID, Since: time.Unix(0, 0),
			Effect: faultEffect(kind, i)})
	}
	n := 0
	for variant, inv := range map[string]inventory.Inventory{
		"healthy": inv.TaintsFor(sliceprobe.Full),
		"faults":  inv.WithFaults(faults).TaintsFor(sliceprobe.Full),
	} {
		node := fmt.Sprintf("%s-%s-%s", machine, name, variant)
		for _, s := range resourceSlices(node, inventory.Resources(node, inv)) {
			if err := writeJSON(filepath.Join(out, "slice-"+s.Name+".json"), s); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// faultEffect is the effect the health monitor gives a fault of kind
// (pkg/health, Monitor.effect): None for an unmonitored GPU, NoSchedule or,
// where the admin configures it, NoExecute (every other GPU here).
func faultEffect(kind string, i int) resourceapi.DeviceTaintEffect {
	switch {
	case kind == health.KindUnmonitored:
		return resourceapi.DeviceTaintEffectNone
	case i%2 == 1:
		return resourceapi.DeviceTaintEffectNoExecute
	}
	return resourceapi.DeviceTaintEffectNoSchedule
}

// resourceSlices are the objects the slice publisher makes of a pool
// (resourceslice's controller): one per slice, of the pool's generation.
func resourceSlices(node string, res resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			obj := &resourceapi.ResourceSlice{
				TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", node, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:                 deviceclass.DriverName,
					Pool:                   resourceapi.ResourcePool{Name: poolName, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
					NodeName:               &node,
					Devices:                s.Devices,
					SharedCounters:         s.SharedCounters,
					PerDeviceNodeSelection: s.PerDeviceNodeSelection,
				},
			}
			if obj.Spec.PerDeviceNodeSelection != nil && *obj.Spec.PerDeviceNodeSelection {
				obj.Spec.NodeName = nil
			}
			out = append(out, obj)
		}
	}
	return out
}

// writeCatalog writes the DeviceClasses of the demo's profiles and the
// templates of its shapes.
func writeCatalog(root, out string) (int, error) {
	n := 0
	var profiles []gpuaas.GpuProfile
	if err := readObjects(filepath.Join(root, "demo", "specs", "quota", "00-profiles.yaml"), "GpuProfile", &profiles); err != nil {
		return 0, err
	}
	for i := range profiles {
		profiles[i].UID = types.UID(fmt.Sprintf("00000000-0000-4000-9000-%012d", i)) // as the API server gives it
		dc, err := deviceclass.Build(&profiles[i], nil)
		if err != nil {
			return n, fmt.Errorf("rendering GpuProfile %s: %w", profiles[i].Name, err)
		}
		dc.TypeMeta = metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"}
		if err := writeJSON(filepath.Join(out, "class-"+dc.Name+".json"), dc); err != nil {
			return n, err
		}
		n++
	}
	shapes, err := filepath.Glob(filepath.Join(root, "demo", "shapes", "*.yaml"))
	if err != nil {
		return n, fmt.Errorf("listing the demo's shapes: %w", err)
	}
	for _, path := range shapes {
		var list []gpuaas.GpuShape
		if err := readObjects(path, "GpuShape", &list); err != nil {
			return n, err
		}
		for i := range list {
			// As the API server gives it: the template's owner reference
			// names the shape by its UID.
			list[i].UID = types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", n))
			tmpl := shape.Template(&list[i], "tenant-a")
			tmpl.TypeMeta = metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"}
			if err := writeJSON(filepath.Join(out, "template-"+tmpl.Name+".json"), tmpl); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// readObjects decodes the documents of kind in a YAML file into out.
func readObjects[T any](path, kind string, out *[]T) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("decoding %s: %w", path, err)
		}
		var meta metav1.TypeMeta
		if err := json.Unmarshal(raw, &meta); err != nil || meta.Kind != kind {
			continue
		}
		var obj T
		if err := json.Unmarshal(raw, &obj); err != nil {
			return fmt.Errorf("decoding a %s of %s: %w", kind, path, err)
		}
		*out = append(*out, obj)
	}
}

func writeJSON(path string, obj any) error {
	data, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
