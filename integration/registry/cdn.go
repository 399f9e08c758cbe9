package registry

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/middleware/redirect" // registers the "redirect" storage middleware
)

// CDN is where a registry started with Options.RedirectBlobs sends its
// blob GETs, as Docker Hub sends them to a CDN and ECR or GCR to an object
// store. Distribution's own "redirect" storage middleware answers them with
// a 307 to the blob's storage path here, and the CDN serves the files of
// the registry's storage directory.
type CDN struct {
	host     string
	recorder *recorder
	files    http.Handler
	bps      atomic.Int64 // per response; <= 0: unthrottled
	stall    atomic.Bool  // answer nothing until the client goes away
	server   *server
}

func startCDN(root string) (*CDN, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cdn: listen: %w", err)
	}
	c := &CDN{host: ln.Addr().String(), recorder: newRecorder(), files: http.FileServer(http.Dir(root))}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 30 * time.Second}
	c.server = serve(ln, srv)
	return c, nil
}

// stop drains the CDN and waits for its requests in flight.
func (c *CDN) stop() error { return shutdown(c.server, c.recorder) }

// redirectTo is the storage middleware that sends blob GETs to c.
func (c *CDN) redirectTo() map[string][]configuration.Middleware {
	return map[string][]configuration.Middleware{"storage": {{
		Name:    "redirect",
		Options: configuration.Parameters{"baseurl": "http://" + c.host},
	}}}
}

func (c *CDN) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rec := Request{Method: req.Method, Path: req.URL.Path, Header: req.Header.Clone(), Kind: KindOther, Start: time.Now()}
	c.recorder.begin("")
	rw := &responseWriter{ResponseWriter: w, ctx: req.Context(), truncateAt: -1, bps: c.bps.Load()}
	defer func() {
		rec.Status, rec.Bytes, rec.End = rw.status, rw.bytes, time.Now()
		c.recorder.end(rec)
	}()
	if c.stall.Load() {
		rec.Faulted = true
		<-req.Context().Done()
		return
	}
	c.files.ServeHTTP(rw, req)
}

// SetRate paces each response body that starts from now on at bps bytes
// per second, so that downloads last long enough to overlap; 0 lifts it.
func (c *CDN) SetRate(bps int64) { c.bps.Store(bps) }

// SetStall makes the CDN answer no request that starts from now on, as a
// storage host that accepts connections and then hangs: each waits until
// its client goes away. false serves again.
func (c *CDN) SetStall(on bool) { c.stall.Store(on) }

// Host returns "127.0.0.1:PORT".
func (c *CDN) Host() string { return c.host }

// Requests returns the finished requests ordered by start time.
func (c *CDN) Requests() []Request { return c.recorder.sorted() }

// WaitIdle blocks until no request is in flight; see Registry.WaitIdle.
func (c *CDN) WaitIdle(ctx context.Context) error { return c.recorder.waitIdle(ctx) }

// PeakConcurrency is the largest number of requests in flight at once.
func (c *CDN) PeakConcurrency() int { return c.recorder.peakInFlight() }

func (rc *recorder) sorted() []Request {
	rc.mu.Lock()
	reqs := slices.Clone(rc.requests)
	rc.mu.Unlock()
	slices.SortStableFunc(reqs, func(a, b Request) int { return a.Start.Compare(b.Start) })
	return reqs
}

func (rc *recorder) peakInFlight() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.peak
}
