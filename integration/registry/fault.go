package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Fault describes how to disturb one request. Fields combine: an auth
// rejection wins, then Delay applies, then either Status is returned or the
// request is served with BytesPerSecond and TruncateAfter applied.
type Fault struct {
	// Status, if non-zero, is returned instead of serving the request.
	Status int
	// RetryAfter sets a Retry-After header (whole seconds, rounded up) on
	// a Status response.
	RetryAfter time.Duration
	// Delay waits before serving; a client that goes away ends the wait.
	Delay time.Duration
	// BytesPerSecond, if positive, paces the response body.
	BytesPerSecond int64
	// TruncateAfter, if positive, sends at most that many body bytes and
	// then aborts the connection.
	TruncateAfter int64
	// RequireBasicAuth rejects requests without these credentials with 401
	// and a Basic challenge.
	RequireBasicAuth *BasicAuth
	// RequireBearer rejects requests without a token from this server for
	// their repository with 401 and a Bearer challenge naming it.
	RequireBearer *TokenServer
}

// BasicAuth holds HTTP basic credentials.
type BasicAuth struct {
	User     string
	Password string
}

// FaultFunc picks the fault for a request, or nil to serve it normally. It
// runs on the request goroutine, concurrently with other requests.
type FaultFunc func(Request) *Fault

// When applies f to the requests that match.
func When(match func(Request) bool, f *Fault) FaultFunc {
	return func(req Request) *Fault {
		if match(req) {
			return f
		}
		return nil
	}
}

// Times lets fn inject at most n faults and serves everything normally
// afterwards, which models transient failures that a retry gets past.
func Times(n int, fn FaultFunc) FaultFunc {
	var used atomic.Int64
	return func(req Request) *Fault {
		f := fn(req)
		if f == nil || used.Add(1) > int64(n) {
			return nil
		}
		return f
	}
}

// SetFault installs fn for subsequent requests; nil removes it.
func (r *Registry) SetFault(fn FaultFunc) {
	if fn == nil {
		r.faults.Store(nil)
		return
	}
	r.faults.Store(&fn)
}

// ServeHTTP records req, applies the installed fault and otherwise hands
// req to the distribution app.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rec := newRequest(req)
	r.recorder.begin(rec.Repo)
	rw := &responseWriter{ResponseWriter: w, ctx: req.Context(), truncateAt: -1}
	defer func() {
		rec.Status, rec.Bytes, rec.End = rw.status, rw.bytes, time.Now()
		r.recorder.end(rec)
	}()

	var f *Fault
	if fn := r.faults.Load(); fn != nil {
		f = (*fn)(rec)
	}
	if f == nil {
		r.app.ServeHTTP(rw, req)
		return
	}
	rec.Faulted = f.apply(r, rw, req, rec.Kind)
	if rw.truncated {
		// Flush what was allowed through so the client sees exactly that
		// much, then drop the connection mid-body.
		rw.flush()
		panic(http.ErrAbortHandler)
	}
}

// apply serves req under f and reports whether f changed the response.
func (f *Fault) apply(r *Registry, rw *responseWriter, req *http.Request, kind Kind) bool {
	if a := f.RequireBasicAuth; a != nil {
		if user, pass, ok := req.BasicAuth(); !ok || user != a.User || pass != a.Password {
			rw.Header().Set("WWW-Authenticate", fmt.Sprintf("Basic realm=%q", r.name))
			writeError(rw, req, http.StatusUnauthorized, "UNAUTHORIZED")
			return true
		}
	}
	if ts := f.RequireBearer; ts != nil {
		_, repo, _ := parsePath(req.URL.Path)
		if !ts.valid(req, repo) {
			rw.Header().Set("WWW-Authenticate", ts.challenge(repo))
			writeError(rw, req, http.StatusUnauthorized, "UNAUTHORIZED")
			return true
		}
	}
	if f.Delay > 0 && sleep(req.Context(), f.Delay) != nil {
		return true
	}
	if f.Status != 0 {
		if f.RetryAfter > 0 {
			secs := int64(math.Ceil(f.RetryAfter.Seconds()))
			rw.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		}
		writeError(rw, req, f.Status, errorCode(f.Status, kind))
		return true
	}
	rw.bps = f.BytesPerSecond
	if f.TruncateAfter > 0 {
		rw.truncateAt = f.TruncateAfter
	}
	r.app.ServeHTTP(rw, req)
	return f.Delay > 0 || (rw.bps > 0 && rw.bytes > 0) || rw.truncated
}

// errorCode picks a distribution error code so clients that parse the body
// see what a real registry would send.
func errorCode(status int, kind Kind) string {
	switch {
	case status == http.StatusNotFound && kind == KindManifest:
		return "MANIFEST_UNKNOWN"
	case status == http.StatusNotFound && kind == KindBlob:
		return "BLOB_UNKNOWN"
	case status == http.StatusNotFound:
		return "NAME_UNKNOWN"
	case status == http.StatusUnauthorized:
		return "UNAUTHORIZED"
	case status == http.StatusForbidden:
		return "DENIED"
	case status == http.StatusTooManyRequests:
		return "TOOMANYREQUESTS"
	case status == http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	}
	return "UNKNOWN"
}

func writeError(w http.ResponseWriter, req *http.Request, status int, code string) {
	body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{
		"code":    code,
		"message": "injected fault: " + http.StatusText(status),
	}}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if req.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// HoldBlobs makes r hold the blob requests of the repositories match
// accepts until the returned release func is called (at the latest when
// the test ends), so tests decide when pulls may finish. A fault installed
// before applies as well, once a held request is released.
func (r *Registry) HoldBlobs(t testing.TB, match func(repo string) bool) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	// Registered after the registry's own cleanup, so it runs first and
	// held handlers can finish before the server shuts down.
	t.Cleanup(release)
	before := r.faults.Load()
	r.SetFault(func(req Request) *Fault {
		if req.Kind == KindBlob && match(req.Repo) {
			<-ch
		}
		if before != nil {
			return (*before)(req)
		}
		return nil
	})
	return release
}
