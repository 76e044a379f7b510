package framework

import (
	"fmt"
	"os"
)

// kubeletDevicePluginDir is where the kubelet's device manager serves
// registration and finds device plugins' sockets: a constant of the
// device-plugin API (pluginapi.DevicePluginPath), not under --root-dir.
const kubeletDevicePluginDir = "/var/lib/kubelet/device-plugins"

// ownDevicePluginDirScript runs in a new mount namespace: / is made
// private there first (only /, not the mounts below it), so that the bind
// mount stays in this namespace even where / is shared with the host;
// the node's directory, a shared mount of its own (makeSharedMount), keeps
// propagating the kubelet's volume mounts to containerd.
const ownDevicePluginDirScript = `set -e
mount --make-private /
mkdir -p ` + kubeletDevicePluginDir + `
mount --bind "$0" ` + kubeletDevicePluginDir + `
exec "$@"`

// withOwnDevicePluginDir makes p (the kubelet) run in a mount namespace of
// its own in which dir is its device-plugin directory. The process keeps
// its PID through unshare and sh (both exec), so Stop still ends it.
func withOwnDevicePluginDir(p *Process, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating the node's device-plugin directory: %w", err)
	}
	args := append([]string{"--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c", ownDevicePluginDirScript, dir, p.Path}, p.Args...)
	p.Path, p.Args = "/usr/bin/unshare", args
	return nil
}
