package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// HoldingProxy stands between a client and the API server and can hold
// back the events of one resource's watches, so that the client's
// informer of it lags the cluster, as behind a slow or congested watch:
// requests go through, and so do the watches' responses, but no event of
// theirs reaches the client until Release. Everything else passes at once.
type HoldingProxy struct {
	resource string // plural, as in the request path
	server   *http.Server
	addr     string

	mu       sync.Mutex
	released chan struct{} // while held: closed by Release
}

// NewHoldingProxy serves on 127.0.0.1 a proxy to the API server of
// upstream (its address and TLS settings; the client's credentials pass
// through) that can hold back the watches of resource.
func NewHoldingProxy(upstream *rest.Config, resource string) (*HoldingProxy, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, fmt.Errorf("the API server's address %q: %w", upstream.Host, err)
	}
	transport, err := rest.TransportFor(&rest.Config{Host: upstream.Host, TLSClientConfig: upstream.TLSClientConfig})
	if err != nil {
		return nil, fmt.Errorf("a transport to the API server: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the proxy: %w", err)
	}
	p := &HoldingProxy{resource: resource, addr: ln.Addr().String()}
	p.server = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:      transport,
		FlushInterval:  -1, // a watch's events as they come
		ModifyResponse: p.holdWatch,
	}}
	go func() { _ = p.server.Serve(ln) }()
	return p, nil
}

// Config is client's configuration with the proxy as its API server. The
// client must authenticate with a token: a client certificate would end
// at the proxy.
func (p *HoldingProxy) Config(client *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(client)
	cfg.Host = "http://" + p.addr
	cfg.TLSClientConfig = rest.TLSClientConfig{}
	return cfg
}

// Hold keeps back from now on what the resource's watches stream.
func (p *HoldingProxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released == nil {
		p.released = make(chan struct{})
	}
}

// Release lets the held events through, in their order.
func (p *HoldingProxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released != nil {
		close(p.released)
		p.released = nil
	}
}

// Close releases what is held and stops serving.
func (p *HoldingProxy) Close() error {
	p.Release()
	if err := p.server.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("closing the proxy: %w", err)
	}
	return nil
}

// holdWatch makes the body of a watch of the resource wait for a release
// before it hands on what it read.
func (p *HoldingProxy) holdWatch(resp *http.Response) error {
	r := resp.Request
	if w := r.URL.Query().Get("watch"); (w == "true" || w == "1") && strings.HasSuffix(r.URL.Path, "/"+p.resource) {
		resp.Body = &heldBody{ReadCloser: resp.Body, proxy: p, ctx: r.Context()}
	}
	return nil
}

// waitReleased returns at once unless held, then when released or ctx
// ends (the client gave up the watch).
func (p *HoldingProxy) waitReleased(ctx context.Context) {
	p.mu.Lock()
	released := p.released
	p.mu.Unlock()
	if released == nil {
		return
	}
	select {
	case <-released:
	case <-ctx.Done():
	}
}

// heldBody is a watch's response body: what arrives while the proxy
// holds is handed on once it releases.
type heldBody struct {
	io.ReadCloser
	proxy *HoldingProxy
	ctx   context.Context
}

func (b *heldBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if n > 0 {
		b.proxy.waitReleased(b.ctx)
	}
	return n, err
}
