package peer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// dynamicMIGConfig offers every GPU as dynamic MIG: the whole GPU and
// every MIG placement, made when a claim is prepared.
const dynamicMIGConfig = "apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\ndefault: {mig: dynamic}\n"

// runDynamicMIG runs both plugins with every GPU of a simulated 8 x H100
// offered as dynamic MIG: ours with `default: {mig: dynamic}`, NVIDIA's
// with its DynamicMIG gate (alpha, off by default). It keeps what each
// publishes (PEER_SLICES_OUT) and, unless PEER_SLICES_ONLY, measures a 1g
// MIG device's prepare (which makes its GPU and compute instance) and
// unprepare (which destroys them) into t. Its own node and machine: the
// whole-GPU rows run on peer-node as NVIDIA's defaults are. The two
// plugins share the machine, one after the other.
func runDynamicMIG(ctx context.Context, t *table) error {
	config := filepath.Join(cp.Dir, "peer-dynamic-mig.yaml")
	if err := os.WriteFile(config, []byte(dynamicMIGConfig), 0o600); err != nil {
		return fmt.Errorf("writing the dynamic MIG node configuration: %w", err)
	}
	p, err := startPeerNode(ctx, "peer-mig", config, true, t.drivers[0].version)
	if err != nil {
		return err
	}
	defer p.stop()
	node, gpuaas, nv := p.node, p.gpuaas, p.nv
	for i, d := range []*driver{gpuaas, nv} {
		// More than the whole GPUs: the MIG placements are published too.
		stored, devices, err := waitPool(ctx, d, node.Name, len(gpus)+1)
		if err != nil {
			return err
		}
		if dir := os.Getenv(envSlicesOut); dir != "" {
			if err := fleet.WriteCapture(filepath.Join(dir, fleet.ShapeDynamicMIG), d.name, stored); err != nil {
				return err
			}
		}
		// The table's columns are the drivers of peer-node; the rows say
		// the shape.
		col := t.drivers[i]
		t.set("ResourceSlices (dynamic MIG): count / devices", col, fmt.Sprintf("%d / %d", len(stored), devices), 0)
		if os.Getenv(envSlicesOnly) != "" {
			continue
		}
		device, err := first1gOnLastGPU(stored)
		if err != nil {
			return fmt.Errorf("%s: %w", d.label, err)
		}
		if err := measureMIGLevels(ctx, t, col, node, d, device); err != nil {
			return err
		}
	}
	return nil
}

// migLevels are the claims already prepared (admin-access whole GPUs on
// gpu-0 to gpu-6) when a 1g MIG device of gpu-7 is measured: the issue's
// 0, 100 and 1,000, as for a whole GPU. The 1,000 level is most of the
// run's time: NVIDIA's plugin takes about a second a prepare there,
// rewriting a checkpoint that grows with every claim.
var migLevels = []int{0, 100, 1000}

func measureMIGLevels(ctx context.Context, t *table, col *driver, node *framework.Node, d *driver, device string) error {
	var background []*drapb.Claim
	for _, level := range migLevels {
		more, err := createClaims(ctx, d, prefix(d, fmt.Sprint("migbg", level)), node.Name, gpus[:len(gpus)-1], level-len(background), true)
		if err != nil {
			return err
		}
		if err := d.prepareInBatches(ctx, more, 50); err != nil {
			return err
		}
		background = append(background, more...)
		row := fmt.Sprintf("1g MIG device (dynamic), %d prepared: ", level)
		if err := measureSerialOn(ctx, t, col, node, d, device, row, fmt.Sprint("mig1g-", level)); err != nil {
			return err
		}
	}
	return nil
}

// first1gOnLastGPU is the name of the first 1g.10gb MIG device (by name,
// not a media-extension one) of gpu-7 in slices: placement 0 for both
// plugins ("gpu-7-mig-1g10gb-0", NVIDIA's "gpu-7-mig-1g10gb-0-0").
func first1gOnLastGPU(stored []resourceapi.ResourceSlice) (string, error) {
	var names []string
	for _, s := range stored {
		for _, d := range s.Spec.Devices {
			if strings.HasPrefix(d.Name, "gpu-7-mig-1g10gb-") && !strings.Contains(d.Name, "me") {
				names = append(names, d.Name)
			}
		}
	}
	if len(names) == 0 {
		return "", errors.New("publishes no 1g.10gb MIG device of gpu-7")
	}
	return slices.Min(names), nil
}

// waitPool waits until d's pool on node is stored whole (every slice of
// one generation, as many as the pool says) with at least minDevices
// devices, and returns its slices and how many devices they hold.
func waitPool(ctx context.Context, d *driver, node string, minDevices int) ([]resourceapi.ResourceSlice, int, error) {
	var items []resourceapi.ResourceSlice
	devices := 0
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: "spec.driver=" + d.name + ",spec.nodeName=" + node,
		})
		if err != nil {
			return false, err
		}
		items, devices = list.Items, 0
		generations := map[int64]bool{}
		for _, s := range items {
			devices += len(s.Spec.Devices)
			generations[s.Spec.Pool.Generation] = true
		}
		whole := len(items) > 0 && len(generations) == 1 && int64(len(items)) == items[0].Spec.Pool.ResourceSliceCount
		return whole && devices >= minDevices, nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("%s: waiting for its whole pool on %s with at least %d devices (have %d in %d slices; log %s): %w",
			d.label, node, minDevices, devices, len(items), d.proc.LogPath, err)
	}
	return items, devices, nil
}
