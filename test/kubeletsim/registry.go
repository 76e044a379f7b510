package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Timings of the registration loop. The kubelet reconciles its plugin
// sockets every second and backs off failed registrations from 500 ms.
const (
	reconcilePeriod   = time.Second
	registerBackoff   = 500 * time.Millisecond
	maxRegisterDelay  = 30 * time.Second
	getInfoTimeout    = time.Second
	pluginCallTimeout = 45 * time.Second
)

// plugin is one registered DRA plugin.
type plugin struct {
	socket       string // the registration socket it came from
	driver       string
	endpoint     string
	registeredAt time.Time
	socketTime   time.Time // modification time of the socket registered
	conn         *grpc.ClientConn
	client       drapb.DRAPluginClient
}

// attempt tracks a socket that failed to register, for backoff.
type attempt struct {
	next  time.Time
	delay time.Duration
}

// registry finds DRA plugins the way the kubelet's plugin watcher and
// plugin manager do: registration sockets appear in a directory (watched
// with inotify, subdirectories included, names starting with "." ignored);
// for each the kubelet calls GetInfo, accepts Type DRAPlugin with a
// supported service, connects to the returned endpoint and confirms with
// NotifyRegistrationStatus. A removed or re-created socket deregisters the
// old registration.
type registry struct {
	dir string

	mu       sync.Mutex
	desired  map[string]time.Time // socket -> its modification time
	actual   map[string]*plugin   // socket -> registration
	attempts map[string]*attempt
	failures []error // every failed registration, oldest first
	wake     chan struct{}
}

func newRegistry(dir string) *registry {
	return &registry{
		dir:      dir,
		desired:  map[string]time.Time{},
		actual:   map[string]*plugin{},
		attempts: map[string]*attempt{},
		wake:     make(chan struct{}, 1),
	}
}

// run watches the directory and keeps registrations in line with the
// sockets in it until ctx ends; then it closes all connections.
func (r *registry) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(r.dir, 0o750); err != nil {
		return fmt.Errorf("creating plugin registry dir: %w", err)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("starting inotify watcher: %w", err)
	}
	defer func() { _ = watcher.Close() }()
	if err := r.traverse(ctx, watcher, r.dir); err != nil {
		return err
	}
	logger.V(2).Info("Watching for plugin sockets", "dir", r.dir)
	ticker := time.NewTicker(reconcilePeriod)
	defer ticker.Stop()
	defer r.closeAll()
	for {
		r.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case ev := <-watcher.Events:
			r.handleEvent(ctx, watcher, ev)
		case err := <-watcher.Errors:
			logger.Error(err, "Inotify watcher error")
		case <-ticker.C:
		case <-r.wake:
		}
	}
}

// traverse watches dir and every directory below it and adds the sockets
// already there.
func (r *registry) traverse(ctx context.Context, watcher *fsnotify.Watcher, dir string) error {
	if err := watcher.Add(dir); err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		if d.IsDir() {
			return r.traverse(ctx, watcher, path)
		}
		r.socketAppeared(ctx, path)
		return nil
	})
}

func (r *registry) handleEvent(ctx context.Context, watcher *fsnotify.Watcher, ev fsnotify.Event) {
	switch {
	case ev.Has(fsnotify.Create):
		if info, err := os.Stat(ev.Name); err == nil && info.IsDir() {
			if err := r.traverse(ctx, watcher, ev.Name); err != nil {
				klog.FromContext(ctx).Error(err, "Watching new plugin directory", "dir", ev.Name)
			}
			return
		}
		r.socketAppeared(ctx, ev.Name)
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		r.mu.Lock()
		delete(r.desired, ev.Name)
		delete(r.attempts, ev.Name)
		r.mu.Unlock()
	}
}

// socketAppeared adds a Unix socket not starting with "." to the desired
// state. Its modification time tells a re-created socket (register anew)
// from a second event about the same one (nothing to do).
func (r *registry) socketAppeared(ctx context.Context, path string) {
	if strings.HasPrefix(filepath.Base(path), ".") {
		return
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode()&os.ModeSocket == 0 {
		klog.FromContext(ctx).V(5).Info("Ignoring non-socket file", "path", path)
		return
	}
	r.mu.Lock()
	if seen, ok := r.desired[path]; !ok || !seen.Equal(info.ModTime()) {
		r.desired[path] = info.ModTime()
		delete(r.attempts, path)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// reconcile deregisters plugins whose socket is gone or was re-created and
// registers sockets that are not registered yet and not backing off. Only
// the run goroutine changes registrations, so the gRPC handshakes run
// without holding the lock that pod workers take to look plugins up.
func (r *registry) reconcile(ctx context.Context) {
	for _, socket := range r.pending(ctx) {
		p, err := r.register(ctx, socket)
		r.mu.Lock()
		if err != nil {
			klog.FromContext(ctx).Error(err, "Plugin registration failed, will retry", "socket", socket)
			r.failures = append(r.failures, err)
			r.backoff(socket, time.Now())
		} else {
			p.socketTime = r.desired[socket]
			r.actual[socket] = p
			delete(r.attempts, socket)
		}
		r.mu.Unlock()
	}
}

// pending drops stale registrations and returns the sockets to register now.
func (r *registry) pending(ctx context.Context) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for socket, p := range r.actual {
		if seen, ok := r.desired[socket]; !ok || !seen.Equal(p.socketTime) {
			r.deregister(ctx, socket)
		}
	}
	now := time.Now()
	var todo []string
	for socket := range r.desired {
		if _, ok := r.actual[socket]; ok {
			continue
		}
		if a := r.attempts[socket]; a != nil && now.Before(a.next) {
			continue
		}
		todo = append(todo, socket)
	}
	sort.Strings(todo)
	return todo
}

func (r *registry) backoff(socket string, now time.Time) {
	a := r.attempts[socket]
	if a == nil {
		a = &attempt{delay: registerBackoff}
		r.attempts[socket] = a
	} else {
		a.delay = min(2*a.delay, maxRegisterDelay)
	}
	a.next = now.Add(a.delay)
}

// register performs the registration handshake with one socket.
func (r *registry) register(ctx context.Context, socket string) (*plugin, error) {
	regConn, err := dialUnix(socket)
	if err != nil {
		return nil, err
	}
	defer func() { _ = regConn.Close() }()
	reg := registerapi.NewRegistrationClient(regConn)
	callCtx, cancel := context.WithTimeout(ctx, getInfoTimeout)
	defer cancel()
	info, err := reg.GetInfo(callCtx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo at %s: %w", socket, err)
	}
	if err := validate(info); err != nil {
		return nil, errors.Join(err, notify(ctx, reg, false, err.Error()))
	}
	endpoint := info.Endpoint
	if endpoint == "" {
		endpoint = socket
	}
	conn, err := dialUnix(endpoint)
	if err != nil {
		return nil, errors.Join(err, notify(ctx, reg, false, err.Error()))
	}
	if err := notify(ctx, reg, true, ""); err != nil {
		_ = conn.Close()
		return nil, err
	}
	klog.FromContext(ctx).Info("Registered DRA plugin", "driver", info.Name, "endpoint", endpoint, "services", info.SupportedVersions)
	return &plugin{socket: socket, driver: info.Name, endpoint: endpoint,
		registeredAt: time.Now(), conn: conn, client: drapb.NewDRAPluginClient(conn)}, nil
}

// validate accepts what the kubelet accepts from a DRA plugin, restricted to
// the one gRPC service the simulator speaks (v1.DRAPlugin).
func validate(info *registerapi.PluginInfo) error {
	if info.Type != registerapi.DRAPlugin {
		return fmt.Errorf("no handler registered for plugin type: %s", info.Type)
	}
	if info.Name == "" {
		return errors.New("plugin reported an empty driver name")
	}
	if !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
		return fmt.Errorf("none of the services supported by the plugin (%q) are supported by the simulator (%q)",
			info.SupportedVersions, []string{drapb.DRAPluginService})
	}
	return nil
}

func notify(ctx context.Context, reg registerapi.RegistrationClient, ok bool, msg string) error {
	callCtx, cancel := context.WithTimeout(ctx, getInfoTimeout)
	defer cancel()
	_, err := reg.NotifyRegistrationStatus(callCtx, &registerapi.RegistrationStatus{PluginRegistered: ok, Error: msg})
	if err != nil && ok {
		return fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	return nil // a plugin may answer a rejection with an error; nothing to do
}

func dialUnix(path string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", path, err)
	}
	return conn, nil
}

func (r *registry) deregister(ctx context.Context, socket string) {
	p := r.actual[socket]
	delete(r.actual, socket)
	if err := p.conn.Close(); err != nil {
		klog.FromContext(ctx).Error(err, "Closing plugin connection", "driver", p.driver)
	}
	klog.FromContext(ctx).Info("Deregistered DRA plugin", "driver", p.driver, "socket", socket)
}

func (r *registry) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for socket, p := range r.actual {
		_ = p.conn.Close()
		delete(r.actual, socket)
	}
}

// get returns the newest registration of a driver, with the kubelet's error
// text when there is none.
func (r *registry) get(driver string) (*plugin, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var newest *plugin
	for _, p := range r.actual {
		if p.driver == driver && (newest == nil || p.registeredAt.After(newest.registeredAt)) {
			newest = p
		}
	}
	if newest == nil {
		return nil, fmt.Errorf("DRA driver %s is not registered", driver)
	}
	return newest, nil
}

// failedRegistrations returns every registration that failed so far.
func (r *registry) failedRegistrations() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.failures)
}

// registeredSince returns when the newest registration of driver happened.
func (r *registry) registeredSince(driver string) (time.Time, bool) {
	p, err := r.get(driver)
	if err != nil {
		return time.Time{}, false
	}
	return p.registeredAt, true
}
