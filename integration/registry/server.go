package registry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
)

// server is one of this package's HTTP servers (the registry, its CDN, a
// WAN front) on its own listener, with the one way they all stop.
//
// It keeps the connections that have not begun a request.
// http.Server.Shutdown waits up to five seconds for such a connection, as
// it may be about to send its first request (golang/go#22682). At a
// test's end none will, yet clients leave them behind: an HTTP transport
// that dials for a request which another connection then serves keeps the
// new one idle without ever using it. Left to Shutdown, each cost a
// registry's cleanup five seconds, which over the integration tests added
// up to minutes.
type server struct {
	srv    *http.Server
	served chan error

	mu        sync.Mutex
	unstarted map[net.Conn]struct{}
}

// serve serves srv on ln until drain or cut.
func serve(ln net.Listener, srv *http.Server) *server {
	s := &server{srv: srv, served: make(chan error, 1), unstarted: map[net.Conn]struct{}{}}
	srv.ConnState = s.state
	go func() { s.served <- srv.Serve(ln) }()
	return s
}

func (s *server) state(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == http.StateNew {
		s.unstarted[c] = struct{}{}
	} else {
		delete(s.unstarted, c)
	}
}

// drain stops the server, giving requests in flight shutdownGrace before
// their connections are cut, and returns how serving ended (nil when by
// drain or cut). A connection accepted while it closes the unstarted ones
// waits out Shutdown as before.
func (s *server) drain() error {
	s.mu.Lock()
	for c := range s.unstarted {
		_ = c.Close()
		delete(s.unstarted, c)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		// Stalled handlers: closing their connections cancels their contexts.
		_ = s.srv.Close()
	}
	return s.wait()
}

// cut stops the server at once: the listener closes and every open
// connection drops, mid-response or not.
func (s *server) cut() error {
	_ = s.srv.Close()
	return s.wait()
}

func (s *server) wait() error {
	if err := <-s.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
