package maintenance

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

const testNode = "node-a"

// The watch reads the label of the plugin's own node and follows it.
func TestWatchUpgradeStateFollowsTheNodesLabel(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{UpgradeStateLabel: "upgrade-required"}}}
	client := fake.NewClientset(node)
	ctx := t.Context()
	read := WatchUpgradeState(ctx, client, testNode)
	waitState := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for read() != want {
			if time.Now().After(deadline) {
				t.Fatalf("upgrade state %q, want %q", read(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitState("upgrade-required")
	node = node.DeepCopy()
	node.Labels[UpgradeStateLabel] = UpgradeStateDriverRestart
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(UpgradeStateDriverRestart)
	delete(node.Labels, UpgradeStateLabel)
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState("")
}
