package e2e

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestHelmPodResourcesMount: with the device-plugin check on (the
// default), the plugin gets the kubelet's pod-resources directory
// read-only and the socket's path under it; with it off, neither.
func TestHelmPodResourcesMount(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	for mode, wantMount := range map[string]bool{"stand-down": true, "exclude-owned": true, "off": false} {
		_, objs := renderChart(t, "gpuaas", "gpuaas-system", "--set", "kubeletPlugin.devicePluginCoexistence="+mode,
			"--set", "kubeletPlugin.kubeletDir=/var/lib/k")
		env, mounts, volumes := map[string]string{}, map[string]map[string]any{}, map[string]map[string]any{}
		for _, o := range objs {
			if o.GetKind() != "DaemonSet" {
				continue
			}
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			ctr := containers[0].(map[string]any)
			vars, _, _ := unstructured.NestedSlice(ctr, "env")
			for _, v := range vars {
				m := v.(map[string]any)
				if value, ok := m["value"].(string); ok {
					env[m["name"].(string)] = value
				}
			}
			ms, _, _ := unstructured.NestedSlice(ctr, "volumeMounts")
			for _, m := range ms {
				mounts[m.(map[string]any)["name"].(string)] = m.(map[string]any)
			}
			vs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
			for _, v := range vs {
				volumes[v.(map[string]any)["name"].(string)] = v.(map[string]any)
			}
		}
		if env["DEVICE_PLUGIN_COEXISTENCE"] != mode {
			t.Errorf("%s: DEVICE_PLUGIN_COEXISTENCE=%q", mode, env["DEVICE_PLUGIN_COEXISTENCE"])
		}
		m, haveMount := mounts["pod-resources"]
		if haveMount != wantMount {
			t.Errorf("%s: pod-resources mounted %v, want %v", mode, haveMount, wantMount)
			continue
		}
		if !wantMount {
			if _, ok := env["POD_RESOURCES_SOCKET"]; ok {
				t.Errorf("%s: POD_RESOURCES_SOCKET set without the mount", mode)
			}
			continue
		}
		path, _, _ := unstructured.NestedString(volumes["pod-resources"], "hostPath", "path")
		if m["mountPath"] != "/var/lib/k/pod-resources" || m["readOnly"] != true || path != "/var/lib/k/pod-resources" ||
			env["POD_RESOURCES_SOCKET"] != "/var/lib/k/pod-resources/kubelet.sock" {
			t.Errorf("%s: mount %v of host path %q, POD_RESOURCES_SOCKET=%q; want <kubeletDir>/pod-resources read-only and its kubelet.sock",
				mode, m, path, env["POD_RESOURCES_SOCKET"])
		}
	}
}
