package e2e

// The kubelet plugin's account may create pods: its MPS control daemons.
// Those pods are privileged on the host, so the chart's admission policy
// (kubeletplugin-policy.yaml, "-mps-pods") must let that account create
// exactly the pod the plugin builds and nothing else: otherwise a stolen
// plugin token runs any command on the node, mounts any host path, or runs
// as the controller's ServiceAccount (issue 25 item 7). These tests act as
// the plugin's account (impersonated, with the node name a pod-bound token
// carries) against a real API server with the chart's RBAC and policies
// installed; no node is needed.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const mpsPolicyGPU = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"

// mpsPolicySetup is one install of the chart's plugin RBAC and policies,
// and what the rendered DaemonSet tells the plugin.
type mpsPolicySetup struct {
	ns, pluginSA, controllerSA, daemonSet string
	// env of the rendered plugin container.
	env map[string]string
	// plugin acts as the plugin's account on helmNodeOK.
	plugin kubernetes.Interface
	// policy names the policy in its refusals.
	policy string
}

// installMPSPolicy renders the chart with args into a new namespace and
// installs its accounts, RBAC and admission policies.
func installMPSPolicy(t *testing.T, release string, args ...string) *mpsPolicySetup {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	s := &mpsPolicySetup{ns: cp.CreateNamespace(t, "mps-policy"), env: map[string]string{}}
	// Pods the old policy let through (or the plugin made) are bound to a
	// node that does not exist: nothing would finish their graceful
	// deletion, so they go at once (cleanups run last-in first-out, before
	// the namespace's).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cp.Client.CoreV1().Pods(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	})
	_, objs := renderChart(t, release, s.ns, args...)
	installKinds := []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
	for _, o := range objs {
		switch o.GetKind() {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			fromUnstructured(t, o, &ds)
			s.daemonSet, s.pluginSA = ds.Name, ds.Spec.Template.Spec.ServiceAccountName
			for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
				s.env[e.Name] = e.Value
			}
		case "Deployment":
			if strings.HasSuffix(o.GetName(), "-controller") {
				var dep appsv1.Deployment
				fromUnstructured(t, o, &dep)
				s.controllerSA = dep.Spec.Template.Spec.ServiceAccountName
			}
		case "ValidatingAdmissionPolicy":
			if strings.HasSuffix(o.GetName(), "-mps-pods") {
				s.policy = o.GetName()
			}
		}
		if !slices.Contains(installKinds, o.GetKind()) {
			continue
		}
		if _, err := cp.ApplyObject(ctx, o, s.ns); err != nil {
			t.Fatal(err)
		}
		if o.GetNamespace() == "" && !slices.Contains([]string{"ServiceAccount", "Role", "RoleBinding"}, o.GetKind()) {
			deleteClusterObjectAtCleanup(t, o)
		}
	}
	if s.pluginSA == "" || s.controllerSA == "" || s.policy == "" || s.env["DRA_PLUGIN_DATA_DIR"] == "" {
		t.Fatalf("rendered chart lacks the plugin's DaemonSet (account %q, env %v), the controller's account (%q) or the MPS pod policy (%q)",
			s.pluginSA, s.env, s.controllerSA, s.policy)
	}
	if s.controllerSA == s.pluginSA {
		t.Fatalf("the controller and the plugin share the account %q", s.pluginSA)
	}
	s.plugin = s.asPlugin(t, helmNodeOK)
	return s
}

func (s *mpsPolicySetup) asPlugin(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", s.ns, s.pluginSA),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + s.ns, "system:authenticated"},
		Extra:    map[string][]string{nodeNameKey: {node}},
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// launcher is the plugin's PodLauncher, wired as cmd/dra-kubelet-plugin
// wires it from the rendered environment, acting as the plugin's account,
// and the daemon of mpsPolicyGPU as mps.Daemons hands it over. The driver
// root the plugin would read is a directory with the control binary.
func (s *mpsPolicySetup) launcher(t *testing.T) (*mps.PodLauncher, mps.Daemon) {
	t.Helper()
	root := t.TempDir()
	bin := filepath.Join(root, "usr", "bin", mps.ControlBinary)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// pkg/plugin keeps the daemons' directories in mps/ of its data dir.
	daemons := &mps.Daemons{DriverRoot: root, Dir: filepath.Join(s.env["DRA_PLUGIN_DATA_DIR"], "mps")}
	d, err := daemons.DaemonOf(mpsPolicyGPU)
	if err != nil {
		t.Fatal(err)
	}
	l := &mps.PodLauncher{Client: s.plugin, Namespace: s.ns, NodeName: helmNodeOK, Image: s.env["MPS_DAEMON_IMAGE"],
		DriverRoot: root, HostDriverRoot: s.env["NVIDIA_HOST_DRIVER_ROOT"], PriorityClassName: s.env["MPS_DAEMON_PRIORITY_CLASS"],
		// What mps.OwnerOf reads from the plugin's pod.
		Owner: &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: s.daemonSet, UID: "plugin-daemonset-uid"}}
	return l, d
}

// waitForPolicy waits until the policy refuses a daemon pod for another
// node: policies take effect a moment after they are created.
func (s *mpsPolicySetup) waitForPolicy(t *testing.T, ctx context.Context, pod *v1.Pod) {
	t.Helper()
	other := pod.DeepCopy()
	other.Spec.NodeName = helmNodeDeny
	other.Labels[mps.NodeLabel] = helmNodeDeny
	var refusal error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var created *v1.Pod
		created, refusal = s.plugin.CoreV1().Pods(s.ns).Create(ctx, other, metav1.CreateOptions{})
		if refusal == nil {
			// Created before the policy was active: remove it and retry.
			_ = cp.Client.CoreV1().Pods(s.ns).Delete(ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			return false, nil
		}
		return strings.Contains(refusal.Error(), s.policy), nil
	})
	if err != nil {
		t.Fatalf("the plugin's account on %s was never refused a daemon pod for %s by %s; last: %v", helmNodeOK, helmNodeDeny, s.policy, refusal)
	}
}

// checkTypeChecked: the API server type-checks a policy's expressions
// against the pod schema and reports what does not fit (a misspelt field
// is an error only when evaluated, which an untested path never is).
func (s *mpsPolicySetup) checkTypeChecked(t *testing.T, ctx context.Context) {
	t.Helper()
	policies := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	var status admissionregv1.ValidatingAdmissionPolicyStatus
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, s.policy, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		status = p.Status
		return p.Status.ObservedGeneration == p.Generation && p.Status.TypeChecking != nil, nil
	})
	if err != nil {
		t.Fatalf("policy %s was never type-checked: %v (status %+v)", s.policy, err, status)
	}
	for _, w := range status.TypeChecking.ExpressionWarnings {
		t.Errorf("policy %s: %s: %s", s.policy, w.FieldRef, w.Warning)
	}
}

// checkPluginPodAllowed: the plugin's own Launch creates its pod through
// the policy, and its Remove deletes it.
func (s *mpsPolicySetup) checkPluginPodAllowed(t *testing.T, ctx context.Context, l *mps.PodLauncher, d mps.Daemon) {
	t.Helper()
	if err := l.Launch(ctx, d); err != nil {
		t.Fatalf("the plugin's own daemon pod was refused: %v", err)
	}
	pods, err := cp.Client.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods after Launch, want 1", len(pods.Items))
	}
	got := pods.Items[0].Spec
	t.Logf("the plugin's daemon pod %s created: account %q, token %v, volumes %s",
		pods.Items[0].Name, got.ServiceAccountName, ptr.Deref(got.AutomountServiceAccountToken, true), hostPaths(got.Volumes))
	if err := l.Remove(ctx, d.GPU); err != nil {
		t.Fatalf("the plugin deleting its daemon pod: %v", err)
	}
}

func hostPaths(vols []v1.Volume) string {
	var out []string
	for _, v := range vols {
		if v.HostPath != nil {
			out = append(out, v.Name+"="+v.HostPath.Path)
		}
	}
	return strings.Join(out, ",")
}

// TestMPSPodPolicyPinsTheDaemonPod: as the plugin's account, the pod the
// plugin builds (pkg/mps, so the test fails when the plugin and the policy
// drift apart) is created and deleted; every variant that would give that
// account more than the daemon needs is refused by the policy.
func TestMPSPodPolicyPinsTheDaemonPod(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	ctx := framework.Context(t, 4*time.Minute)
	s := installMPSPolicy(t, "mpspol")
	l, d := s.launcher(t)
	base, err := l.Pod(d)
	if err != nil {
		t.Fatal(err)
	}
	s.waitForPolicy(t, ctx, base)
	s.checkTypeChecked(t, ctx)
	s.checkPluginPodAllowed(t, ctx, l, d)

	ctr := func(p *v1.Pod) *v1.Container { return &p.Spec.Containers[0] }
	hostPath := func(name, path string) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path}}}
	}
	mount := func(p *v1.Pod, v v1.Volume, at string) {
		p.Spec.Volumes = append(p.Spec.Volumes, v)
		ctr(p).VolumeMounts = append(ctr(p).VolumeMounts, v1.VolumeMount{Name: v.Name, MountPath: at})
	}
	variants := []struct {
		what   string
		change func(p *v1.Pod)
	}{
		// Another identity.
		{"the controller's ServiceAccount", func(p *v1.Pod) { p.Spec.ServiceAccountName = s.controllerSA }},
		{"the controller's ServiceAccount by the deprecated field", func(p *v1.Pod) {
			p.Spec.ServiceAccountName, p.Spec.DeprecatedServiceAccount = "", s.controllerSA
		}},
		{"the plugin's own ServiceAccount", func(p *v1.Pod) { p.Spec.ServiceAccountName = s.pluginSA }},
		{"a mounted token", func(p *v1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) }},
		{"a token left to the default", func(p *v1.Pod) { p.Spec.AutomountServiceAccountToken = nil }},
		{"a projected token volume", func(p *v1.Pod) {
			mount(p, v1.Volume{Name: "token", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
				Sources: []v1.VolumeProjection{{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}}}}}}, "/token")
		}},
		{"image pull secrets", func(p *v1.Pod) { p.Spec.ImagePullSecrets = []v1.LocalObjectReference{{Name: "registry"}} }},
		// More of the host.
		{"an extra hostPath volume", func(p *v1.Pod) { mount(p, hostPath("kubelet", "/var/lib/kubelet"), "/kubelet") }},
		{"the host's root as the GPU directory", func(p *v1.Pod) { p.Spec.Volumes[1].HostPath.Path = "/" }},
		{"another directory of the plugin as the GPU directory", func(p *v1.Pod) {
			p.Spec.Volumes[1].HostPath.Path = s.env["DRA_PLUGIN_DATA_DIR"]
		}},
		{"another host path as the driver root", func(p *v1.Pod) { p.Spec.Volumes[0].HostPath.Path = "/etc" }},
		{"a host path created when missing", func(p *v1.Pod) {
			p.Spec.Volumes[1].HostPath.Type = ptr.To(v1.HostPathDirectoryOrCreate)
		}},
		{"the driver root writable", func(p *v1.Pod) { ctr(p).VolumeMounts[0].ReadOnly = false }},
		{"a sub path of the driver root", func(p *v1.Pod) { ctr(p).VolumeMounts[0].SubPath = "etc" }},
		{"a mount propagated back to the host", func(p *v1.Pod) {
			ctr(p).VolumeMounts[1].MountPropagation = ptr.To(v1.MountPropagationBidirectional)
		}},
		{"a volume mounted elsewhere", func(p *v1.Pod) { ctr(p).VolumeMounts[1].MountPath = "/mps" }},
		{"a termination message file over the control binary", func(p *v1.Pod) {
			ctr(p).TerminationMessagePath = "/driver-root/usr/bin/" + mps.ControlBinary
		}},
		{"an emptyDir volume", func(p *v1.Pod) {
			mount(p, v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, "/scratch")
		}},
		{"the host's IPC namespace", func(p *v1.Pod) { p.Spec.HostIPC = true }},
		{"a shared process namespace", func(p *v1.Pod) {
			p.Spec.HostPID = false
			p.Spec.ShareProcessNamespace = ptr.To(true)
		}},
		// Other privileges.
		{"added capabilities", func(p *v1.Pod) {
			ctr(p).SecurityContext.Capabilities = &v1.Capabilities{Add: []v1.Capability{"SYS_ADMIN"}}
		}},
		{"an SELinux type of its own", func(p *v1.Pod) { ctr(p).SecurityContext.SELinuxOptions = &v1.SELinuxOptions{Type: "spc_t"} }},
		{"another user", func(p *v1.Pod) { ctr(p).SecurityContext.RunAsUser = ptr.To[int64](1000) }},
		{"a pod security context", func(p *v1.Pod) {
			p.Spec.SecurityContext = &v1.PodSecurityContext{SupplementalGroups: []int64{0}}
		}},
		{"another priority class", func(p *v1.Pod) { p.Spec.PriorityClassName = "system-cluster-critical" }},
		// Another program.
		{"another command", func(p *v1.Pod) { ctr(p).Command = []string{"/bin/sh", "-c", "cat /driver-root/etc/shadow"} }},
		{"args after the command", func(p *v1.Pod) { ctr(p).Args = []string{"extra"} }},
		{"a control binary in the writable GPU directory", func(p *v1.Pod) {
			ctr(p).Command[3] = "/tmp/" + mps.ControlBinary
		}},
		{"another binary in the driver root", func(p *v1.Pod) { ctr(p).Command[3] = "/usr/bin/nvidia-smi" }},
		{"another image", func(p *v1.Pod) { ctr(p).Image = "registry.example/attacker:1" }},
		{"LD_PRELOAD", func(p *v1.Pod) {
			ctr(p).Env = append(ctr(p).Env, v1.EnvVar{Name: "LD_PRELOAD", Value: "/tmp/evil.so"})
		}},
		{"another PATH", func(p *v1.Pod) { ctr(p).Env[3].Value = "/tmp:" + ctr(p).Env[3].Value }},
		{"env from a Secret", func(p *v1.Pod) {
			ctr(p).EnvFrom = []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "s"}}}}
		}},
		{"another GPU than its label", func(p *v1.Pod) {
			ctr(p).Env[0].Value = "GPU-00000000-1111-2222-3333-444444444444"
		}},
		{"a postStart hook", func(p *v1.Pod) {
			ctr(p).Lifecycle = &v1.Lifecycle{PostStart: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"/bin/sh", "-c", "id"}}}}
		}},
		{"an exec liveness probe", func(p *v1.Pod) {
			ctr(p).LivenessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"/bin/sh", "-c", "id"}}}}
		}},
		{"an extra container of the driver's image", func(p *v1.Pod) {
			extra := ctr(p).DeepCopy()
			extra.Name = "extra"
			extra.Command = []string{"/bin/sh", "-c", "id"}
			p.Spec.Containers = append(p.Spec.Containers, *extra)
		}},
		{"an extra copy of the daemon container", func(p *v1.Pod) {
			extra := ctr(p).DeepCopy()
			extra.Name = "extra"
			p.Spec.Containers = append(p.Spec.Containers, *extra)
		}},
		{"an init container of the driver's image", func(p *v1.Pod) {
			init := ctr(p).DeepCopy()
			init.Name = "init"
			init.Command = []string{"/bin/sh", "-c", "id"}
			p.Spec.InitContainers = []v1.Container{*init}
		}},
		{"a controller owner", func(p *v1.Pod) { p.OwnerReferences[0].Controller = ptr.To(true) }},
	}
	for _, v := range variants {
		p := base.DeepCopy()
		v.change(p)
		created, err := s.plugin.CoreV1().Pods(s.ns).Create(ctx, p, metav1.CreateOptions{})
		if err == nil {
			t.Errorf("the plugin's account created a daemon pod with %s (%s)", v.what, created.Name)
			_ = cp.Client.CoreV1().Pods(s.ns).Delete(ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			continue
		}
		mustBeForbidden(t, "a daemon pod with "+v.what, err, s.policy)
	}

	// The plugin's pod on another node is refused, and a pod of its own
	// node is deleted only through the plugin's labels.
	other := s.asPlugin(t, helmNodeDeny)
	_, err = other.CoreV1().Pods(s.ns).Create(ctx, base, metav1.CreateOptions{})
	mustBeForbidden(t, "a daemon pod of "+helmNodeOK+" by the plugin of "+helmNodeDeny, err, s.policy)
}

// TestMPSPodPolicyFollowsChartPaths: with a driver root and kubelet
// directory of another distribution (trailing slashes included) and no
// priority class, the plugin's pod is still allowed, and the default
// paths are not.
func TestMPSPodPolicyFollowsChartPaths(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	ctx := framework.Context(t, 3*time.Minute)
	values := writeValues(t, "paths.yaml", `
kubeletPlugin:
  driverRoot: /run/nvidia/driver/
  kubeletDir: /var/lib/k0s/kubelet/
  priorityClassName: ""
`)
	s := installMPSPolicy(t, "mpspaths", "--values", values)
	l, d := s.launcher(t)
	base, err := l.Pod(d)
	if err != nil {
		t.Fatal(err)
	}
	if got := base.Spec.Volumes[0].HostPath.Path; got != "/run/nvidia/driver" {
		t.Fatalf("the plugin mounts driver root %q, want /run/nvidia/driver", got)
	}
	s.waitForPolicy(t, ctx, base)
	s.checkPluginPodAllowed(t, ctx, l, d)
	for what, change := range map[string]func(p *v1.Pod){
		"the default kubelet directory": func(p *v1.Pod) {
			p.Spec.Volumes[1].HostPath.Path = strings.Replace(p.Spec.Volumes[1].HostPath.Path, "/var/lib/k0s/kubelet", "/var/lib/kubelet", 1)
		},
		"the host's root as the driver root": func(p *v1.Pod) { p.Spec.Volumes[0].HostPath.Path = "/" },
		"the default priority class":         func(p *v1.Pod) { p.Spec.PriorityClassName = "system-node-critical" },
	} {
		_, err := s.plugin.CoreV1().Pods(s.ns).Create(ctx, withChange(base, change), metav1.CreateOptions{})
		mustBeForbidden(t, "a daemon pod with "+what, err, s.policy)
	}
}

func withChange(p *v1.Pod, change func(*v1.Pod)) *v1.Pod {
	p = p.DeepCopy()
	change(p)
	return p
}
