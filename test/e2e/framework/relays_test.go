package framework

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// echoName serves connections that are each answered with name.
func echoName(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintln(c, name)
		}
	}()
	return ln.Addr().String()
}

// A connection made before a switch is closed by it; the next one reaches
// the new target.
func TestTCPSwitchMovesConnections(t *testing.T) {
	a, b := echoName(t, "a"), echoName(t, "b")
	sw, err := NewTCPSwitch()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sw.Close() }()
	sw.SwitchTo(a)
	first, err := net.Dial("tcp", sw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Close() }()
	r := bufio.NewReader(first)
	if got, err := r.ReadString('\n'); got != "a\n" || err != nil {
		t.Fatalf("before the switch: %q, %v; want a", got, err)
	}
	sw.SwitchTo(b)
	if _, err := r.ReadString('\n'); err != io.EOF {
		t.Errorf("the connection open to a after the switch: %v, want it closed", err)
	}
	second, err := net.Dial("tcp", sw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Close() }()
	if got, err := bufio.NewReader(second).ReadString('\n'); got != "b\n" || err != nil {
		t.Errorf("after the switch: %q, %v; want b", got, err)
	}
}

// A watch of the held resource delivers nothing while held and everything,
// in order, once released; other requests pass while it is held.
func TestHoldingProxyHoldsOneResourcesWatches(t *testing.T) {
	events := make(chan string)
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			_, _ = fmt.Fprint(w, "list of ", r.URL.Path)
			return
		}
		w.(http.Flusher).Flush() // the headers, as the API server sends them at once
		for e := range events {
			_, _ = fmt.Fprintln(w, e)
			w.(http.Flusher).Flush()
		}
	}))
	defer api.Close()
	defer close(events)
	p, err := NewHoldingProxy(&rest.Config{Host: api.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, "resourceclaims")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	base := p.Config(&rest.Config{}).Host

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/apis/resource.k8s.io/v1/resourceclaims?watch=true", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	events <- "before"
	if got := <-lines; got != "before" {
		t.Fatalf("first event %q, want before", got)
	}

	p.Hold()
	events <- "held-1"
	events <- "held-2"
	if got := get(t, ctx, base+"/api/v1/pods"); got != "list of /api/v1/pods" {
		t.Errorf("a request while held: %q", got)
	}
	select {
	case got := <-lines:
		t.Fatalf("event %q delivered while held", got)
	default:
	}
	p.Release()
	for _, want := range []string{"held-1", "held-2"} {
		if got := <-lines; got != want {
			t.Errorf("after the release: %q, want %q", got, want)
		}
	}
}

func get(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}
