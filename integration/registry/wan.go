package registry

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// WAN models a registry reached over a wide-area link rather than loopback:
// every request waits Latency before it is served, and all response bodies
// share one bandwidth budget, the way all pulls of a node share its uplink.
// A per-response limit (Fault.BytesPerSecond) would instead let 20 parallel
// pulls go 20 times as fast as one, which is what loopback already does and
// what a real link never does.
type WAN struct {
	// Latency is added before each request is handled (a round trip).
	Latency time.Duration
	// BytesPerSecond is the budget shared by all response bodies; <= 0
	// means unlimited.
	BytesPerSecond int64
}

// DefaultWAN is the WAN profile of the benchmarks: 20 ms per request and
// 64 MiB/s shared.
var DefaultWAN = WAN{Latency: 20 * time.Millisecond, BytesPerSecond: 64 << 20}

// wanChunk bounds one limited write, and is the limiter's burst: small
// enough that concurrent responses interleave smoothly, large enough that
// the limiter is not consulted for every few bytes.
const wanChunk = 32 << 10

// Handler wraps h with the profile. Each call makes a new budget: wrap a
// registry once and serve all its clients through the result.
func (p WAN) Handler(h http.Handler) http.Handler {
	var lim *rate.Limiter
	if p.BytesPerSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(p.BytesPerSecond), wanChunk)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if err := sleep(req.Context(), p.Latency); err != nil {
			return // the client went away
		}
		if lim != nil {
			w = &sharedRateWriter{ResponseWriter: w, ctx: req.Context(), lim: lim}
		}
		h.ServeHTTP(w, req)
	})
}

// sharedRateWriter paces body writes through a limiter shared with other
// responses. Like the registry's own writer it does not implement
// io.ReaderFrom, so every byte goes through Write.
type sharedRateWriter struct {
	http.ResponseWriter
	ctx context.Context
	lim *rate.Limiter
}

func (w *sharedRateWriter) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		chunk := p[:min(len(p), wanChunk)]
		if err := w.lim.WaitN(w.ctx, len(chunk)); err != nil {
			return n, err
		}
		m, err := w.ResponseWriter.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		p = p[len(chunk):]
	}
	return n, nil
}

// Flush passes through, so streamed responses are not held back.
func (w *sharedRateWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *sharedRateWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeWAN serves r behind the profile p on another loopback port and
// returns that port's "127.0.0.1:PORT"; r's own address stays unthrottled,
// so seeding is not slowed down. Requests through either address are
// recorded by r. Image references for the WAN path replace r.Host() with
// the returned host; distribution serves pulls whatever the Host header
// says. The listener stops when the test ends.
func (r *Registry) ServeWAN(t testing.TB, p WAN) string {
	t.Helper()
	f, err := r.ListenWAN(p)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after Start's cleanup, so it runs first: the front stops
	// before the registry behind it.
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	return f.Host()
}

// Front is a Registry served behind a WAN profile on its own loopback port.
type Front struct {
	name   string
	host   string
	server *server
	once   sync.Once
	err    error
}

// ListenWAN is ServeWAN for programs outside tests: the front runs until
// Close or Cut.
func (r *Registry) ListenWAN(p WAN) (*Front, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("registry %s: WAN listener: %w", r.name, err)
	}
	srv := &http.Server{Handler: p.Handler(r), ReadHeaderTimeout: 30 * time.Second}
	return &Front{name: r.name, host: ln.Addr().String(), server: serve(ln, srv)}, nil
}

// Host returns the front's "127.0.0.1:PORT".
func (f *Front) Host() string { return f.host }

// URL returns "http://127.0.0.1:PORT".
func (f *Front) URL() string { return "http://" + f.host }

// Close stops the front, giving in-flight requests a grace period. Later
// calls (and Cut) return the first call's result.
func (f *Front) Close() error { return f.stop(f.server.drain) }

// Cut stops the front at once, the way a host that crashes goes away: the
// listener closes and every open connection drops, mid-response or not.
func (f *Front) Cut() error { return f.stop(f.server.cut) }

func (f *Front) stop(how func() error) error {
	f.once.Do(func() {
		if err := how(); err != nil {
			f.err = fmt.Errorf("registry %s: WAN listener: %w", f.name, err)
		}
	})
	return f.err
}
