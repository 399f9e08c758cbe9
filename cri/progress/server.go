// Package progress serves image pull progress streams (KEP-5334) over
// HTTP. Each stream is reached through a URL whose token is random, single
// use, short-lived and scoped to what it was issued for, so one pod cannot
// watch another pod's pulls.
package progress

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/pullwise/pullwise/transfer/hub"
)

// DefaultInterval is how often a stream sends the latest state of each
// layer at most.
const DefaultInterval = 250 * time.Millisecond

const pathPrefix = "/progress/"

// Server serves progress streams.
type Server struct {
	hub      *hub.Hub
	ttl      time.Duration
	interval time.Duration
	base     string // http://host:port

	mu     sync.Mutex
	grants map[string]grant // by token

	srv    *http.Server
	served chan struct{}
}

type grant struct {
	sel     hub.Selector
	expires time.Time
}

// Listen starts a server on address:port (port 0 picks one).
func Listen(h *hub.Hub, address string, port int, ttl, interval time.Duration) (*Server, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen for progress streams: %w", err)
	}
	s := &Server{
		hub:      h,
		ttl:      ttl,
		interval: interval,
		base:     "http://" + l.Addr().String(),
		grants:   map[string]grant{},
		served:   make(chan struct{}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+pathPrefix+"{token}", s.stream)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.L.WithError(err).Error("progress server stopped")
		}
	}()
	return s, nil
}

// Addr is the server's base URL.
func (s *Server) Addr() string { return s.base }

// Close stops the server and ends every stream.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.served
	return err
}

// Issue returns a URL for one stream of the pulls sel matches. The URL
// works once, within the token lifetime.
func (s *Server) Issue(sel hub.Selector) (string, error) {
	var b [16]byte // 128 bits
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make token: %w", err)
	}
	token := hex.EncodeToString(b[:])
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Unused tokens are dropped as they expire, so an idle stream of
	// requests cannot grow the table.
	for t, g := range s.grants {
		if now.After(g.expires) {
			delete(s.grants, t)
		}
	}
	s.grants[token] = grant{sel: sel, expires: now.Add(s.ttl)}
	return s.base + pathPrefix + token, nil
}

// redeem consumes a token. Unknown, used and expired tokens look alike.
func (s *Server) redeem(token string) (hub.Selector, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.grants[token]
	delete(s.grants, token)
	if !ok || time.Now().After(g.expires) {
		return nil, false
	}
	return g.sel, true
}

// stream writes newline-delimited JSON: the current state first, then
// updates, at most one line per layer per interval. With ?follow=false it
// writes the current state and ends; otherwise it ends when the watched
// pulls are over or the client goes away.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	sel, ok := s.redeem(r.PathValue("token"))
	if !ok {
		http.NotFound(w, r)
		return
	}
	follow := !strings.EqualFold(r.URL.Query().Get("follow"), "false")
	sub := s.hub.Subscribe(sel)
	defer sub.Close()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		// Send the headers now: a client waiting for a pull that has not
		// started yet must see the stream open.
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	write := func(lines []hub.Event) bool {
		for _, l := range lines {
			if err := enc.Encode(l); err != nil {
				return false
			}
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}

	if !follow {
		lines, _ := sub.Take()
		write(lines)
		return
	}
	ctx := r.Context()
	c := newCoalescer(s.interval)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	over := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.Ready():
			var lines []hub.Event
			lines, over = sub.Take()
			c.add(lines, time.Now())
		case <-timer.C:
		}
		now := time.Now()
		var due []hub.Event
		if over {
			due = c.flush() // the end: everything, in order
		} else {
			due = c.due(now)
		}
		if len(due) > 0 && !write(due) {
			return
		}
		if over {
			return
		}
		if next, ok := c.next(); ok {
			timer.Reset(max(next.Sub(now), 0))
		}
	}
}
