package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// The ledger is how every replica of the controller sees the claims the
// others admitted a moment ago: reservations live in the API, one
// ConfigMap ("book") per cohort, or per tenant outside any cohort, and are
// written with optimistic concurrency, as the ResourceQuota admission
// writes a quota's status. Two replicas that decide on the same version of
// a book cannot both write it: the loser re-reads the book, sees the
// winner's reservation and decides again. A cohort shares one book because
// borrowing makes its members' decisions depend on each other.
//
// When a reservation counts, and when a book drops it, is decided in
// reservation.go.
const (
	ledgerLabel   = "gpuaas.io/quota-ledger"
	ledgerDataKey = "reservations"
	// ledgerSettledKey holds the book's settled resourceVersion: the
	// latest of the claims whose reservations a replica dropped because
	// its cache showed them (cacheprogress.go).
	ledgerSettledKey = "settledResourceVersion"
	// ledgerAttempts bounds the re-decisions after write conflicts; two
	// replicas serialize in-process, so conflicts come in ones.
	ledgerAttempts = 8
	// groupTimeout bounds one group commit (reads and the write), past
	// the longest webhook timeout its callers may be waiting with.
	groupTimeout = 30 * time.Second
)

// Caps on a book's size. A ConfigMap holds at most 1 MiB, and a book that
// cannot be written fails every admission of its cohort closed; reservations
// of creates that then fail (AlreadyExists, a later admission plugin) stay
// for reservationGrace, so without a cap a tenant could fill it. Past a cap
// the admission is refused with a message saying so instead. One tenant may
// fill a quarter of its book, so the others of its cohort keep room; a
// reservation is typically ~250 bytes, so that is over 700 claims admitted
// and not yet seen, far more than a burst of 200 claims/s leaves in
// settleDelay.
const (
	maxBookBytes       = 768 << 10
	maxTenantBookBytes = maxBookBytes / 4
)

// bookState is what a book holds: its reservations and how far a
// replica's cache must have got before it decides on them.
type bookState struct {
	entries []reservation
	settled string
}

// Ledger keeps this process's view of the books and writes them.
type Ledger struct {
	client    client.Client // uncached: books are read and written live
	namespace string

	mu    sync.Mutex
	books map[string]*book
}

// NewLedger keeps its books as ConfigMaps in namespace (the controller's
// own), read and written through c, which must not be a cached client.
func NewLedger(c client.Client, namespace string) *Ledger {
	return &Ledger{client: c, namespace: namespace, books: map[string]*book{}}
}

// book is one ConfigMap of reservations. Its turn serializes this
// process's commits on the book (a conflict then only comes from another
// process); admissions that arrive during a commit queue for the next one.
type book struct {
	turn   chan struct{} // holds one token while a group commits
	qmu    sync.Mutex
	queue  []*pendingAdmission
	key    types.NamespacedName
	owner  string            // "cohort/<name>" or "tenant/<name>", for people
	cm     *corev1.ConfigMap // as last read or written; nil: not in the API yet
	loaded bool
	// state is the book as last read or written; readers that do not
	// hold turn (status reports, dry runs) load it atomically.
	state atomic.Pointer[bookState]
}

// bookFor returns the book of a tenant: its cohort's, or its own.
func (l *Ledger) bookFor(t quota.Tenant) *book {
	owner := bookOwner(t)
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.books[owner]
	if !ok {
		b = &book{owner: owner, turn: make(chan struct{}, 1),
			key: types.NamespacedName{Namespace: l.namespace, Name: bookName(owner)}}
		l.books[owner] = b
	}
	return b
}

// bookOwner names whose decisions a tenant's depend on: its cohort's, or
// its own outside any cohort.
func bookOwner(t quota.Tenant) string {
	if t.Cohort != "" {
		return "cohort/" + t.Cohort
	}
	return "tenant/" + t.Name
}

// bookName is readable where the owner's name allows it.
func bookName(owner string) string {
	kind, name := owner[:6], owner[7:] // "cohort" or "tenant"
	readable := "gpuaas-quota-" + kind + "-" + name
	if len(validation.IsDNS1123Subdomain(readable)) == 0 {
		return readable
	}
	sum := sha256.Sum256([]byte(owner))
	return "gpuaas-quota-" + kind + "-" + hex.EncodeToString(sum[:8])
}

// snapshot is what the book said when last read or written.
func (b *book) snapshot() bookState {
	if st := b.state.Load(); st != nil {
		return *st
	}
	return bookState{}
}

// load reads the book from the API (caller holds b.turn).
func (b *book) load(ctx context.Context, c client.Client) error {
	var cm corev1.ConfigMap
	err := c.Get(ctx, b.key, &cm)
	switch {
	case apierrors.IsNotFound(err):
		b.cm = nil
		b.state.Store(nil)
	case err != nil:
		return fmt.Errorf("reading quota ledger %s: %w", b.key, err)
	default:
		entries, err := decodeBook(&cm)
		if err != nil {
			// A damaged book must not stop admission: it is rewritten by
			// the next admission, and the claims it held are in the
			// caches within seconds anyway.
			klog.FromContext(ctx).Error(err, "Quota ledger unreadable, starting it afresh", "book", b.key)
		}
		b.cm = &cm
		b.state.Store(&bookState{entries: entries, settled: cm.Data[ledgerSettledKey]})
	}
	b.loaded = true
	return nil
}

func decodeBook(cm *corev1.ConfigMap) ([]reservation, error) {
	raw := cm.Data[ledgerDataKey]
	if raw == "" {
		return nil, nil
	}
	var entries []reservation
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		return nil, fmt.Errorf("decoding quota ledger %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return entries, nil
}

// write stores entries with the version last read as precondition (caller
// holds b.turn). A conflict means another replica wrote first.
func (b *book) write(ctx context.Context, c client.Client, st bookState) error {
	raw, err := json.Marshal(st.entries)
	if err != nil {
		return fmt.Errorf("encoding quota ledger %s: %w", b.key, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: b.key.Namespace, Name: b.key.Name,
		Labels:      map[string]string{ledgerLabel: "true", managedByLabel: managedBy},
		Annotations: map[string]string{ledgerLabel: b.owner},
	}}
	if b.cm != nil {
		cm = b.cm.DeepCopy()
	}
	cm.Data = map[string]string{ledgerDataKey: string(raw)}
	if st.settled != "" {
		cm.Data[ledgerSettledKey] = st.settled
	}
	if b.cm == nil {
		err = c.Create(ctx, cm)
	} else {
		err = c.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("writing quota ledger %s: %w", b.key, err)
	}
	b.cm = cm
	b.state.Store(&st)
	return nil
}

// conflicted tells a lost race from a failure: another replica wrote the
// book first, or the sweeper deleted it (booksweep.go); either way the
// book is read again.
func conflicted(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)
}

// pendingAdmission is a caller waiting for its claim's decision.
type pendingAdmission struct {
	claim *resourceapi.ResourceClaim
	// overrule lifts limits for the claim (admitOverruled); nil for none.
	overrule *overruling
	// priced is the claim's price under its caller's deadline.
	priced *priced
	done   chan admitResult // buffered: answered once
}

type admitResult struct {
	adm Admission
	err error
}

func (b *book) enqueue(req *pendingAdmission) {
	b.qmu.Lock()
	b.queue = append(b.queue, req)
	b.qmu.Unlock()
}

// withdraw takes an admission whose caller gave up out of the queue, if no
// group has taken it yet.
func (b *book) withdraw(req *pendingAdmission) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.queue = slices.DeleteFunc(b.queue, func(r *pendingAdmission) bool { return r == req })
}

// takeQueue hands the waiting admissions to the caller that holds b.turn.
func (b *book) takeQueue() []*pendingAdmission {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	q := b.queue
	b.queue = nil
	return q
}

func answer(group []*pendingAdmission, results []admitResult) {
	for i, req := range group {
		req.done <- results[i]
	}
}

func answerAll(group []*pendingAdmission, err error) {
	for _, req := range group {
		req.done <- admitResult{err: err}
	}
}
