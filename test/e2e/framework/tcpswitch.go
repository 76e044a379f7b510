package framework

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// TCPSwitch is one address that relays each connection to a target the
// test chooses, as a Service does to the pod behind it. Switching closes
// the connections open to the previous target, so a client that keeps its
// connections alive (the API server calling a webhook) dials the new one
// with its next request.
type TCPSwitch struct {
	ln net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	target string                // "" refuses connections
	open   map[net.Conn]struct{} // both ends of every relay
}

// NewTCPSwitch listens on 127.0.0.1, with no target yet.
func NewTCPSwitch() (*TCPSwitch, error) {
	return ListenTCPSwitch("127.0.0.1:0")
}

// ListenTCPSwitch is NewTCPSwitch on addr: a test can have clients dial an
// address that refuses connections (nothing listens there yet) and open
// it later.
func ListenTCPSwitch(addr string) (*TCPSwitch, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for the switch on %s: %w", addr, err)
	}
	s := &TCPSwitch{ln: ln, open: map[net.Conn]struct{}{}}
	s.wg.Go(s.serve)
	return s, nil
}

// Addr is where clients connect: "127.0.0.1:port".
func (s *TCPSwitch) Addr() string { return s.ln.Addr().String() }

// SwitchTo relays new connections to target ("host:port") and closes
// those open to the previous one.
func (s *TCPSwitch) SwitchTo(target string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.target = target
	for c := range s.open {
		_ = c.Close()
	}
	clear(s.open)
}

// Close stops listening and closes every relay.
func (s *TCPSwitch) Close() error {
	err := s.ln.Close()
	s.SwitchTo("")
	s.wg.Wait()
	return err
}

func (s *TCPSwitch) serve() {
	for {
		in, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		s.wg.Go(func() { s.relay(in) })
	}
}

// relay copies both ways between in and the target of the moment, until
// either end closes or the switch moves.
func (s *TCPSwitch) relay(in net.Conn) {
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	if target == "" {
		_ = in.Close()
		return
	}
	out, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		_ = in.Close()
		return
	}
	s.mu.Lock()
	if s.target != target { // switched while dialling
		s.mu.Unlock()
		_, _ = in.Close(), out.Close()
		return
	}
	s.open[in], s.open[out] = struct{}{}, struct{}{}
	s.mu.Unlock()

	done := make(chan struct{}, 2)
	copyTo := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go copyTo(out, in)
	go copyTo(in, out)
	<-done
	_, _ = in.Close(), out.Close()
	<-done
	s.mu.Lock()
	delete(s.open, in)
	delete(s.open, out)
	s.mu.Unlock()
}
