package registry

import (
	"net"
	"net/http"
	"sync"
)

// unstarted are a server's connections that have not begun a request.
// http.Server.Shutdown waits up to five seconds for such a connection, as
// it may be about to send its first request (golang/go#22682). At a
// test's end none will, yet clients leave them behind: an HTTP transport
// that dials for a request which another connection then serves keeps the
// new one idle without ever using it. Left to Shutdown, each costs a
// registry's cleanup five seconds, which over the integration tests added
// up to minutes.
type unstarted struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// track follows srv's connections; close ends those that have not begun a
// request.
func track(srv *http.Server) *unstarted {
	u := &unstarted{conns: map[net.Conn]struct{}{}}
	srv.ConnState = u.state
	return u
}

func (u *unstarted) state(c net.Conn, s http.ConnState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if s == http.StateNew {
		u.conns[c] = struct{}{}
	} else {
		delete(u.conns, c)
	}
}

// len is how many there are.
func (u *unstarted) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.conns)
}

// close is for a server whose listener is closed or about to be: a
// connection accepted after it waits out Shutdown as before.
func (u *unstarted) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		_ = c.Close()
		delete(u.conns, c)
	}
}
