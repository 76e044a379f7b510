package hardwareprofiles

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// queuesFresh is how long a namespace's LocalQueues, once listed, serve
// every owner's pass: each pass asks for every Kueue-managed tenant
// namespace, and listing each for each profile and shape was, at fleet
// size (hundreds of namespaces, tens of owners), most of the publisher's
// reads. A LocalQueue made or removed is so taken in up to this much
// later, on an owner's resync.
const queuesFresh = 10 * time.Second

// queueMemo holds each namespace's LocalQueues as last listed. Its zero
// value is ready; the profiles' and the shapes' controllers share it.
type queueMemo struct {
	mu sync.Mutex
	// now is the clock (tests set it); nil: time.Now.
	now     func() time.Time
	entries map[string]queueEntry
}

// queueEntry is a namespace's LocalQueues by name, each its ClusterQueue.
type queueEntry struct {
	at     time.Time
	queues map[string]string
}

func (m *queueMemo) clock() time.Time {
	if m.now == nil {
		return time.Now()
	}
	return m.now()
}

// queuesIn is namespace's LocalQueues (name to ClusterQueue), listed
// through r.Direct unless listed within queuesFresh.
func (r *Reconciler) queuesIn(ctx context.Context, namespace string) (map[string]string, error) {
	m := &r.queues
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	if e, ok := m.entries[namespace]; ok && now.Sub(e.at) < queuesFresh {
		return e.queues, nil
	}
	list := kueue.Object("LocalQueueList")
	items := &unstructured.UnstructuredList{Object: list.Object}
	if err := r.Direct.List(ctx, items, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing LocalQueues in %s: %w", namespace, err)
	}
	queues := make(map[string]string, len(items.Items))
	for _, lq := range items.Items {
		queues[lq.GetName()], _, _ = unstructured.NestedString(lq.Object, "spec", "clusterQueue")
	}
	if m.entries == nil {
		m.entries = map[string]queueEntry{}
	}
	m.entries[namespace] = queueEntry{at: now, queues: queues}
	return queues, nil
}
