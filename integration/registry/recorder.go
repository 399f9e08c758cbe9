package registry

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// recorder keeps finished requests and in-flight statistics. Peaks are
// tracked here rather than derived from Start/End afterwards because
// timestamps of requests that touch at the edges are ambiguous.
type recorder struct {
	mu         sync.Mutex
	requests   []Request
	inFlight   int
	repos      map[string]int // in-flight requests per repository
	peak       int
	peakRepos  int
	peakByRepo map[string]int
	idle       chan struct{} // closed whenever inFlight == 0
}

func newRecorder() *recorder {
	idle := make(chan struct{})
	close(idle)
	return &recorder{repos: map[string]int{}, peakByRepo: map[string]int{}, idle: idle}
}

func (rc *recorder) begin(repo string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.inFlight == 0 {
		rc.idle = make(chan struct{})
	}
	rc.inFlight++
	rc.peak = max(rc.peak, rc.inFlight)
	if repo == "" {
		return
	}
	rc.repos[repo]++
	rc.peakByRepo[repo] = max(rc.peakByRepo[repo], rc.repos[repo])
	rc.peakRepos = max(rc.peakRepos, len(rc.repos))
}

func (rc *recorder) end(req Request) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.requests = append(rc.requests, req)
	if req.Repo != "" {
		if rc.repos[req.Repo]--; rc.repos[req.Repo] == 0 {
			delete(rc.repos, req.Repo)
		}
	}
	if rc.inFlight--; rc.inFlight == 0 {
		close(rc.idle)
	}
}

func (rc *recorder) waitIdle(ctx context.Context) error {
	rc.mu.Lock()
	idle, n := rc.idle, rc.inFlight
	rc.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d requests still in flight: %w", n, ctx.Err())
	}
}

// Requests returns the finished requests ordered by start time.
func (r *Registry) Requests() []Request { return r.recorder.sorted() }

// Count returns how many finished requests match filter; nil matches all.
func (r *Registry) Count(filter func(Request) bool) int {
	n := 0
	for _, req := range r.Requests() {
		if filter == nil || filter(req) {
			n++
		}
	}
	return n
}

// Reset forgets finished requests and restarts the peaks from what is in
// flight now, so seeding traffic does not leak into assertions.
func (r *Registry) Reset() {
	rc := r.recorder
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.requests = nil
	rc.peak = rc.inFlight
	rc.peakRepos = len(rc.repos)
	rc.peakByRepo = maps.Clone(rc.repos)
}

// WaitIdle blocks until no request is in flight. A client can finish reading
// a response a moment before the handler returns and the request is
// recorded, so call this before asserting on Requests.
func (r *Registry) WaitIdle(ctx context.Context) error {
	return r.recorder.waitIdle(ctx)
}

// PeakConcurrency is the largest number of requests in flight at once.
func (r *Registry) PeakConcurrency() int { return r.recorder.peakInFlight() }

// PeakRepos is the largest number of distinct repositories that had a
// request in flight at the same instant; requests without a repository
// (e.g. /v2/) are not counted.
func (r *Registry) PeakRepos() int {
	r.recorder.mu.Lock()
	defer r.recorder.mu.Unlock()
	return r.recorder.peakRepos
}

// PeakByRepo is, per repository, the largest number of its requests that
// were in flight at once.
func (r *Registry) PeakByRepo() map[string]int {
	r.recorder.mu.Lock()
	defer r.recorder.mu.Unlock()
	return maps.Clone(r.recorder.peakByRepo)
}
