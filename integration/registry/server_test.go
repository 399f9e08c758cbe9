package registry

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pullwise/pullwise/internal/await"
)

// TestCloseDoesNotWaitForUnstartedConnections: a connection that never
// sends a request (a client's spare dial) does not hold a server's close
// for the five seconds net/http would give it, and is closed.
func TestCloseDoesNotWaitForUnstartedConnections(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start returns the server's host, the server and how to close
		// it.
		start func(t *testing.T) (string, *server, func() error)
	}{
		{"registry", func(t *testing.T) (string, *server, func() error) {
			r, err := New(t.TempDir(), Options{})
			require.NoError(t, err)
			return r.Host(), r.server, r.Close
		}},
		{"cdn", func(t *testing.T) (string, *server, func() error) {
			r, err := New(t.TempDir(), Options{RedirectBlobs: true})
			require.NoError(t, err)
			return r.CDN().Host(), r.CDN().server, r.Close
		}},
		{"wan front", func(t *testing.T) (string, *server, func() error) {
			r := Start(t, Options{})
			f, err := r.ListenWAN(DefaultWAN)
			require.NoError(t, err)
			return f.Host(), f.server, f.Close
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, srv, closeServer := tc.start(t)
			c, err := net.Dial("tcp", host)
			require.NoError(t, err)
			defer c.Close()
			await.Until(t, 10*time.Second, "the server to accept the connection", func() bool { return srv.unstartedLen() == 1 })

			start := time.Now()
			require.NoError(t, closeServer())
			took := time.Since(start)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
			_, err = c.Read(make([]byte, 1))
			require.ErrorIs(t, err, io.EOF, "the unstarted connection is closed")
			require.Less(t, took, shutdownGrace-time.Second, "close waited on a connection that sent no request")
		})
	}
}

// unstartedLen is how many connections have not begun a request.
func (s *server) unstartedLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unstarted)
}
