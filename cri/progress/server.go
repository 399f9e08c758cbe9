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
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/log"
	"golang.org/x/net/netutil"

	"github.com/pullwise/pullwise/transfer/hub"
)

// DefaultInterval is how often a stream sends the latest state of each
// layer at most.
const DefaultInterval = 250 * time.Millisecond

// Defaults of Options; see there.
const (
	DefaultMaxConnections = 1024
	DefaultClientTimeout  = 10 * time.Second
)

const (
	pathPrefix = "/progress/"
	tokenLen   = 32 // hex of 128 bits
	// maxHeaderBytes bounds what a request may send before its handler
	// runs (net/http adds 4 KiB of slack and answers 431 beyond it). A
	// progress URL is under 100 bytes.
	maxHeaderBytes = 8 << 10
	// maxQuery bounds the query string; the only parameter is follow.
	maxQuery = 64
)

// Options configure a Server.
type Options struct {
	Address string
	Port    int // 0 picks a free port
	// TokenTTL is how long an issued URL stays valid unused.
	TokenTTL time.Duration
	// Interval is how often a stream sends each layer's latest state at
	// most; DefaultInterval when zero.
	Interval time.Duration
	// MaxConnections caps the connections served at once, so clients that
	// open connections and hold them cannot grow the daemon's memory:
	// further connections wait in the kernel's accept queue.
	// DefaultMaxConnections when zero.
	MaxConnections int
	// ClientTimeout bounds how long a client may take to send its request
	// headers, how long a kept-alive connection may sit idle, and how long
	// one write of a stream may wait for a client that does not read.
	// DefaultClientTimeout when zero.
	ClientTimeout time.Duration
}

// Server serves progress streams.
type Server struct {
	hub           *hub.Hub
	ttl           time.Duration
	interval      time.Duration
	clientTimeout time.Duration
	base          string // http://host:port

	mu     sync.Mutex
	grants map[string]grant // by token

	srv    *http.Server
	served chan struct{}
}

type grant struct {
	sel     hub.Selector
	expires time.Time
}

// Listen starts a server as o says.
func Listen(h *hub.Hub, o Options) (*Server, error) {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = DefaultMaxConnections
	}
	if o.ClientTimeout <= 0 {
		o.ClientTimeout = DefaultClientTimeout
	}
	l, err := net.Listen("tcp", net.JoinHostPort(o.Address, strconv.Itoa(o.Port)))
	if err != nil {
		return nil, fmt.Errorf("listen for progress streams: %w", err)
	}
	s := &Server{
		hub:           h,
		ttl:           o.TokenTTL,
		interval:      o.Interval,
		clientTimeout: o.ClientTimeout,
		base:          "http://" + l.Addr().String(),
		grants:        map[string]grant{},
		served:        make(chan struct{}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+pathPrefix+"{token}", s.stream)
	// No WriteTimeout: it would cut every stream after a fixed time, and a
	// stream lasts as long as its pulls. Each write gets its own deadline
	// instead (see stream).
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: o.ClientTimeout,
		IdleTimeout:       o.ClientTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(netutil.LimitListener(l, o.MaxConnections)); err != nil && !errors.Is(err, http.ErrServerClosed) {
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
	// A bad query is refused before the token is looked at, so that it
	// neither uses the token up nor tells anything about it.
	follow, err := parseFollow(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	token := r.PathValue("token")
	if len(token) != tokenLen {
		http.NotFound(w, r)
		return
	}
	sel, ok := s.redeem(token)
	if !ok {
		http.NotFound(w, r)
		return
	}
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
	rc := http.NewResponseController(w)
	write := func(lines []hub.Event) bool {
		// A client that stops reading fills the socket buffers, and a
		// write then blocks: the deadline ends the stream and frees the
		// connection instead of holding it for as long as the client likes.
		if err := rc.SetWriteDeadline(time.Now().Add(s.clientTimeout)); err != nil {
			return false
		}
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

// parseFollow reads the only query parameter, follow (true when absent).
// Other parameters are ignored, so that clients may add their own.
func parseFollow(r *http.Request) (bool, error) {
	if len(r.URL.RawQuery) > maxQuery {
		return false, fmt.Errorf("query longer than %d bytes", maxQuery)
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return false, fmt.Errorf("bad query: %w", err)
	}
	v := q.Get("follow")
	if v == "" {
		return true, nil
	}
	follow, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("follow must be true or false, got %q", v)
	}
	return follow, nil
}
