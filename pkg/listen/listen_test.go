package listen

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestWhenFreeServesOnceTheHolderLeaves(t *testing.T) {
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := holder.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan net.Listener, 1)
	if err := WhenFree(ctx, "test", addr, func(l net.Listener) { got <- l }); err != nil {
		t.Fatalf("WhenFree with the port taken: %v, want a background retry", err)
	}
	select {
	case <-got:
		t.Fatal("served while the port was still taken")
	case <-time.After(2 * retryInterval):
	}
	_ = holder.Close()
	select {
	case l := <-got:
		if l.Addr().String() != addr {
			t.Errorf("served on %s, want %s", l.Addr(), addr)
		}
		_ = l.Close()
	case <-time.After(10 * retryInterval):
		t.Fatal("never served after the port was freed")
	}
}

func TestWhenFreeReportsOtherErrors(t *testing.T) {
	err := WhenFree(context.Background(), "test", "256.0.0.1:1", func(net.Listener) { t.Error("served") })
	if err == nil {
		t.Fatal("no error for an address that cannot be listened on")
	}
}
