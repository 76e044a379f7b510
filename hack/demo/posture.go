package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// Faults the demo puts on the real node, so that the posture table shows
// every state a GPU can be in.
const (
	demoFaultyGPU  = "5"     // the shared GPU: a critical XID
	demoDrainedDev = "gpu-7" // the whole-GPU device of a dynamic-MIG GPU
)

// healthScenario injects an XID into the real node's simulated GPU 5 (as
// `mocknvml xid` does) and drains GPU 7's whole-GPU device with a
// DeviceTaintRule, as an operator would.
func (d *demo) healthScenario(ctx context.Context) error {
	if d.real == nil {
		d.out.printf("\nHealth: skipped (it injects faults into the real node's simulated GPUs).\n")
		return nil
	}
	d.out.printf("\nHealth: XID 79 on GPU %s (mocknvml xid), DeviceTaintRule draining %s ...\n", demoFaultyGPU, demoDrainedDev)
	stateDir := filepath.Join(d.real.KubeletDir, "plugins", framework.DriverName, "mock-nvml")
	if err := nvmock.InjectEvent(stateDir, demoFaultyGPU, nvml.EventTypeXidCriticalError, 79, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		return fmt.Errorf("injecting an XID: %w", err)
	}
	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-drain-" + demoDrainedDev},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(framework.DriverName), Pool: ptr.To(d.opts.nodeName), Device: ptr.To(demoDrainedDev)},
			Taint:          resourceapi.DeviceTaint{Key: "gpu.gpuaas.io/drain", Value: "maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
	if _, err := d.cp.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("draining %s: %w", demoDrainedDev, err)
	}
	return nil
}

// reportPosture prints the node's GpuNode as `kubectl get gpunodes` and
// `kubectl get gpunode <node> -o yaml` would; with faults (the health
// scenario ran) once the controller has seen the faults the demo injected.
func (d *demo) reportPosture(ctx context.Context, faults bool) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	var node gpuaas.GpuNode
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, types.NamespacedName{Name: d.opts.nodeName}, &node); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return !faults || node.Status.Summary.Faulty > 0 && node.Status.Summary.Draining > 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the posture of %s: %w", d.opts.nodeName, err)
	}
	s := node.Status.Summary
	d.out.printf("\nkubectl get gpunodes\n%-16s %-18s %4s %9s %7s %9s %8s %9s\n", "NAME", "NODE-POSTURE", "GPUS", "AVAILABLE", "PARTIAL", "ALLOCATED", "DRAINING", "UNHEALTHY")
	d.out.printf("%-16s %-18s %4d %9d %7d %9d %8d %9d\n", node.Name, node.Status.Posture, s.GPUs, s.Available, s.PartiallyAllocated, s.Allocated, s.Draining, s.Faulty)
	d.out.printf("\nGPU  MODE         POSTURE             REASON\n")
	for _, g := range node.Status.GPUs {
		d.out.printf("%-4d %-12s %-19s %s\n", g.Index, g.Mode, g.Posture, firstClause(g.Reason))
	}
	return nil
}

// firstClause keeps a reason to one line.
func firstClause(s string) string {
	if len(s) > 110 {
		return strings.TrimSpace(s[:107]) + "..."
	}
	return s
}

// client reads the controller's kinds (GpuNode, GpuShape).
func (d *demo) client() (client.Client, error) {
	crlog.SetLogger(klog.Background().WithName("controller-runtime"))
	scheme, err := controller.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(d.cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	return c, nil
}
