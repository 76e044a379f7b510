// Command nodesim simulates the kubelet of one node against any cluster:
// it registers the Node and keeps it Ready, registers the DRA plugins whose
// sockets appear in the plugin registry directory, and prepares and
// unprepares the ResourceClaims of the pods bound to the node through the
// plugins' gRPC API, like the kubelet. No containers run. See
// test/kubeletsim.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpuaas/gpu-dra-driver/test/kubeletsim"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file of the cluster [$KUBECONFIG]")
	nodeName := flag.String("node-name", "", "name of the simulated node (required)")
	registryDir := flag.String("plugins-registry-dir", kubeletsim.DefaultRegistryDir, "directory watched for plugin registration sockets")
	labels := flag.String("labels", "", "extra node labels, key=value[,key=value...]")
	klog.InitFlags(nil)
	flag.Parse()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, *kubeconfig, *nodeName, *registryDir, *labels); err != nil {
		klog.ErrorS(err, "nodesim failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

func run(ctx context.Context, kubeconfig, nodeName, registryDir, labelList string) error {
	if nodeName == "" {
		return errors.New("--node-name is required")
	}
	labels, err := parseLabels(labelList)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	sim, err := kubeletsim.New(kubeletsim.Config{Client: client, NodeName: nodeName, RegistryDir: registryDir, Labels: labels})
	if err != nil {
		return err
	}
	return sim.Run(klog.NewContext(ctx, klog.Background().WithName("nodesim")))
}

// parseLabels reads "a=b,c=d".
func parseLabels(list string) (map[string]string, error) {
	labels := map[string]string{}
	if list == "" {
		return labels, nil
	}
	for _, kv := range strings.Split(list, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--labels: %q is not key=value", kv)
		}
		labels[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return labels, nil
}
