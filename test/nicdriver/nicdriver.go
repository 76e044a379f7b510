// Package nicdriver is a test double of another vendor's DRA driver: it
// publishes NICs on a node, each with the standard
// resource.kubernetes.io/pcieRoot attribute, and prepares one CDI device per
// allocated NIC, whose only edit is an environment variable naming the NIC
// and its root. It is not part of the product: the tests use it to show
// that a GpuShape aligns our GPUs with another driver's devices on a real
// kubelet (issue 38). It shares no code with our plugin on purpose: a
// second driver is only a fair test if it is written the way any vendor
// would write one, on k8s.io/dynamic-resource-allocation alone.
package nicdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// DriverName is the double's DRA driver name: example.com, so that it
	// can never be mistaken for a real vendor's.
	DriverName = "nic.example.com"
	// cdiKind is the CDI vendor/class of the NICs.
	cdiKind = "example.com/nic"
	// cdiVersion: environment edits alone need no newer CDI version.
	cdiVersion = "0.6.0"
	// EnvPrefix starts the variable each prepared NIC sets in a container:
	// NIC_<DEVICE>=<pcieRoot>, e.g. NIC_ETH0=pci0000:37.
	EnvPrefix = "NIC_"
)

// NIC is one device the double publishes.
type NIC struct {
	// Name is the device name in the slice (a DNS label, e.g. eth0).
	Name string
	// PCIeRoot is its resource.kubernetes.io/pcieRoot, e.g. pci0000:37.
	PCIeRoot string
}

// Options say where the double runs.
type Options struct {
	Client   kubernetes.Interface
	NodeName string
	// KubeletDir is the kubelet's --root-dir: the double registers under
	// its plugins_registry and serves under plugins/<DriverName>.
	KubeletDir string
	// CDIRoot is where the container runtime reads CDI specs.
	CDIRoot string
	NICs    []NIC
}

// Driver is a running double.
type Driver struct {
	helper  *kubeletplugin.Helper
	cdiRoot string
	roots   map[string]string // device name -> pcieRoot
}

// Start registers the double with the kubelet and publishes its NICs in
// one pool named after the node. Stop it with Stop.
func Start(ctx context.Context, opts Options) (*Driver, error) {
	d := &Driver{cdiRoot: opts.CDIRoot, roots: map[string]string{}}
	for _, n := range opts.NICs {
		d.roots[n.Name] = n.PCIeRoot
	}
	dataDir := filepath.Join(opts.KubeletDir, "plugins", DriverName)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("creating the plugin directory: %w", err)
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(opts.Client),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(opts.KubeletDir, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		return nil, fmt.Errorf("starting the %s kubelet plugin: %w", DriverName, err)
	}
	d.helper = helper
	if err := helper.PublishResources(ctx, resources(opts.NodeName, opts.NICs)); err != nil {
		helper.Stop()
		return nil, fmt.Errorf("publishing the NICs of %s: %w", opts.NodeName, err)
	}
	return d, nil
}

// Stop unregisters the double; its slices stay until deleted (as any
// driver's do when its plugin stops).
func (d *Driver) Stop() { d.helper.Stop() }

func resources(node string, nics []NIC) resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(nics))
	for _, n := range nics {
		devices = append(devices, resourceapi.Device{
			Name: n.Name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": {StringValue: ptr.To("nic")},
				deviceattribute.StandardDeviceAttributePCIeRoot: {StringValue: ptr.To(n.PCIeRoot)},
			},
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

// PrepareResourceClaims writes one CDI spec per claim with a device per
// allocated NIC.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devices, err := d.prepare(c)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Preparing NICs", "claim", klog.KObj(c))
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return out, nil
}

func (d *Driver) prepare(c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	spec := cdispec.Spec{Version: cdiVersion, Kind: cdiKind}
	var devices []kubeletplugin.Device
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		root, ok := d.roots[r.Device]
		if !ok {
			return nil, fmt.Errorf("claim %s/%s: NIC %s is not one of this node's", c.Namespace, c.Name, r.Device)
		}
		// The claim's UID in the CDI name: never reused, so a runtime's
		// cached spec cannot answer for another claim.
		name := string(c.UID) + "-" + r.Device
		spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: cdispec.ContainerEdits{
			Env: []string{EnvVar(r.Device) + "=" + root},
		}})
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{cdiKind + "=" + name},
		})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encoding the CDI spec of claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if err := os.WriteFile(d.specPath(c.UID), data, 0o600); err != nil {
		return nil, fmt.Errorf("writing the CDI spec of claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	return devices, nil
}

// EnvVar is the variable a container gets for NIC device: NIC_<DEVICE>.
func EnvVar(device string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(device, "-", "_"))
}

func (d *Driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiRoot, "example.com-nic_"+string(uid)+".json")
}

// UnprepareResourceClaims removes the claims' CDI specs; a spec already
// gone is not an error (the kubelet may ask twice).
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("removing the CDI spec of claim %s: %w", c.String(), err)
		}
		out[c.UID] = err
	}
	return out, nil
}

// HandleError logs background errors (publishing slices): a test double
// has no better place for them, and the test sees their effect.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg, "driver", DriverName)
}

// WatchHealthStatus: the double reports no health.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
