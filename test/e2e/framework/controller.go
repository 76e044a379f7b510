package framework

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
)

// ExpectAnnotation marks a demo object that the admission webhook must
// refuse (value "denied"), e.g. a claim over its tenant's quota.
const ExpectAnnotation = "demo.gpuaas.io/expect"

// Build compiles one of the repository's commands into dir.
func Build(ctx context.Context, dir, cmd string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(cmd))
	c := exec.CommandContext(ctx, "go", "build", "-o", out, "./"+cmd)
	c.Dir = root
	if output, err := c.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", cmd, err, output)
	}
	return out, nil
}

// StartController installs the CRDs (config/crd) and runs the dra-controller
// binary against the control plane, its webhook on 127.0.0.1. It returns
// once the kube-apiserver calls the webhook. The controller removes its
// webhook configuration when stopped, so a stopped controller blocks nothing.
// extraArgs are appended to its command line.
func (cp *ControlPlane) StartController(ctx context.Context, binary string, extraArgs ...string) (*Process, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	if _, err := cp.Apply(ctx, filepath.Join(root, "config", "crd"), ""); err != nil {
		return nil, fmt.Errorf("installing CRDs: %w", err)
	}
	ports, err := FreePorts(2)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--kubeconfig", cp.Kubeconfig,
		"--metrics-addr", "0", "--health-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--webhook-host", "127.0.0.1", "--webhook-port", fmt.Sprint(ports[0]),
		"--webhook-url", fmt.Sprintf("https://127.0.0.1:%d", ports[0]),
		"--webhook-cert-dir", filepath.Join(cp.Dir, "dra-controller-certs"),
		"--webhook-remove-on-exit", "--resync", "5s", "-v", "2"}, extraArgs...)
	p := NewProcess("dra-controller", binary, filepath.Join(cp.LogDir, "dra-controller.log"), args...)
	if err := p.Start(); err != nil {
		return nil, err
	}
	if err := cp.waitForWebhook(ctx, p); err != nil {
		return nil, errors.Join(err, p.Stop())
	}
	return p, nil
}

// waitForWebhook dry-runs a claim until the webhook answers it: only then
// are quotas enforced.
func (cp *ControlPlane) waitForWebhook(ctx context.Context, p *Process) error {
	probe := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-probe", Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "probe", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "probe"},
		}}}},
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("dra-controller exited: %w\n%s", err, p.Tail(20))
		}
		if _, err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "gpuaas-dra-controller", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := cp.Client.ResourceV1().ResourceClaims("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the dra-controller webhook: %w", err)
	}
	return nil
}

// Denial is an object the webhook refused as the demo expected.
type Denial struct {
	Object  *unstructured.Unstructured
	Message string
}

// ApplyFile applies the objects of one file in order, as Apply does, with
// what the catalog and quota need: objects annotated to be denied must be
// refused (their denials are returned), and after a GpuProfile or
// TenantQuota it waits until the controller has observed it, so the next
// objects are judged against it.
func (cp *ControlPlane) ApplyFile(ctx context.Context, file, defaultNamespace string) ([]*unstructured.Unstructured, []Denial, error) {
	objs, err := ReadObjects(file)
	if err != nil {
		return nil, nil, err
	}
	return cp.ApplyObjects(ctx, file, objs, defaultNamespace)
}

// ApplyObjects is ApplyFile for objects read (and perhaps changed) by the
// caller; file only names them in errors.
func (cp *ControlPlane) ApplyObjects(ctx context.Context, file string, objs []*unstructured.Unstructured, defaultNamespace string) ([]*unstructured.Unstructured, []Denial, error) {
	var applied []*unstructured.Unstructured
	var denials []Denial
	for _, obj := range objs {
		out, err := cp.ApplyObject(ctx, obj, defaultNamespace)
		if obj.GetAnnotations()[ExpectAnnotation] == "denied" {
			if err == nil {
				return applied, denials, fmt.Errorf("%s: %s %s was admitted, the demo expects it denied", file, obj.GetKind(), objectName(obj))
			}
			denials = append(denials, Denial{Object: obj, Message: err.Error()})
			continue
		}
		if err != nil {
			return applied, denials, fmt.Errorf("%s: %w", file, err)
		}
		if err := cp.waitObserved(ctx, obj, out); err != nil {
			return applied, denials, err
		}
		applied = append(applied, out)
	}
	return applied, denials, nil
}

// waitObserved waits for status.observedGeneration of our CRDs.
func (cp *ControlPlane) waitObserved(ctx context.Context, obj, out *unstructured.Unstructured) error {
	if out.GroupVersionKind().Group != "gpuaas.io" {
		return nil
	}
	ri, err := cp.resourceFor(obj, "")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cur, err := ri.Get(ctx, out.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		seen, _, _ := unstructured.NestedInt64(cur.Object, "status", "observedGeneration")
		return seen >= cur.GetGeneration(), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the controller to observe %s %s: %w", out.GetKind(), out.GetName(), err)
	}
	return nil
}
