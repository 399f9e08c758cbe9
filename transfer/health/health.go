// Package health remembers which registry hosts fail, so that one node's
// pulls stop paying for a mirror that is down: a host that fails is skipped
// for a cooldown that grows while it keeps failing, then one request probes
// it. It knows nothing of containerd; the per-host client in
// transfer/hostclient asks it before each request and tells it how each went.
package health

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
)

// Key names a registry endpoint the way a hosts.toml entry does: scheme,
// host with port, and the API path prefix, which differs for override_path
// mirrors.
type Key struct {
	Scheme string
	Host   string
	Path   string
}

func (k Key) String() string { return k.Scheme + "://" + k.Host + k.Path }

// Outcome is how one request to a host went.
type Outcome string

const (
	OK          Outcome = "ok"           // status below 400
	Answer      Outcome = "answer"       // 4xx other than 429: the host works, the answer is no
	Throttled   Outcome = "throttled"    // 429
	ServerError Outcome = "server_error" // 5xx
	Unreachable Outcome = "unreachable"  // connection refused or reset, TLS, DNS
	Timeout     Outcome = "timeout"      // no response headers, or a body that stopped
	Skipped     Outcome = "skipped"      // not sent: the host is marked down
	Canceled    Outcome = "canceled"     // the caller went away; says nothing of the host
)

// Outcomes lists every outcome, in the order metrics show them.
var Outcomes = []Outcome{OK, Answer, Throttled, ServerError, Unreachable, Timeout, Skipped, Canceled}

// Config is how the node treats registry hosts.
type Config struct {
	// Cooldown is how long a failed host is skipped at first; it doubles
	// with each failed probe up to MaxCooldown. Zero turns the memory off:
	// every request goes to every host in order, as in stock containerd.
	Cooldown    time.Duration
	MaxCooldown time.Duration
	// ResponseTimeout bounds the wait for response headers; ReadTimeout
	// bounds a body read that delivers nothing. Zero leaves either to the
	// caller's deadline.
	ResponseTimeout time.Duration
	ReadTimeout     time.Duration
	// ThrottleLimit is how many 429 answers in a row count as a failure.
	// containerd repeats a throttled request itself, so one 429 is not one.
	ThrottleLimit int
	// MaxRetryWait bounds the wait a throttled host may ask for: after a
	// 429, requests to the host wait as long as its Retry-After says (or,
	// without one, as its 429 streak says), when that is no longer than
	// MaxRetryWait; longer, they fail at once. Zero sends them at once, as
	// containerd does.
	MaxRetryWait time.Duration
}

// DefaultThrottleLimit matches the attempts containerd's resolver makes for
// one request (maxAttempts in core/remotes/docker): a host that throttles
// all of them has failed that request.
const DefaultThrottleLimit = 5

// maxIdleHosts bounds the table on a node that meets many registries over a
// long uptime: past it, hosts that are up and idle for a day are forgotten.
const (
	maxIdleHosts = 256
	idleForget   = 24 * time.Hour
)

// Table is the node's memory of registry hosts. Its methods are safe for
// concurrent use. A nil *Table remembers nothing and skips nothing.
type Table struct {
	cfg Config
	now func() time.Time

	mu    sync.Mutex
	hosts map[Key]*host
}

type host struct {
	down      bool
	failures  int // failed probes in a row since it went down, plus one
	throttled int // 429 answers in a row
	probing   bool
	since     time.Time // of the current state
	until     time.Time // end of the cooldown while down
	lastError string
	lastErrAt time.Time
	lastUsed  time.Time
	requests  map[Outcome]uint64
	serves    []Key // registries whose blob downloads this host served after a redirect

	// No request before retryAt: the host answered 429 (throttle.go).
	// After it, one request at a time tries the host (retryProbe, closed
	// when it is answered) while the others wait for its answer. askedAt
	// is when the host said it may be asked again, for errors: retryAt
	// may be sooner.
	retryAt    time.Time
	askedAt    time.Time
	retryProbe chan struct{}
}

// New returns an empty table.
func New(cfg Config) *Table {
	if cfg.ThrottleLimit <= 0 {
		cfg.ThrottleLimit = DefaultThrottleLimit
	}
	if cfg.MaxCooldown < cfg.Cooldown {
		cfg.MaxCooldown = cfg.Cooldown
	}
	return &Table{cfg: cfg, now: time.Now, hosts: map[Key]*host{}}
}

// Config returns the table's configuration; the zero Config for nil.
func (t *Table) Config() Config {
	if t == nil {
		return Config{}
	}
	return t.cfg
}

func (t *Table) remembers() bool { return t != nil && t.cfg.Cooldown > 0 }

// get returns k's entry, making it; t.mu is held.
func (t *Table) get(k Key, now time.Time) *host {
	h := t.hosts[k]
	if h == nil {
		if len(t.hosts) >= maxIdleHosts {
			t.forgetIdle(now)
		}
		h = &host{since: now, requests: map[Outcome]uint64{}}
		t.hosts[k] = h
	}
	h.lastUsed = now
	return h
}

func (t *Table) forgetIdle(now time.Time) {
	for k, h := range t.hosts {
		if !h.down && now.Sub(h.lastUsed) > idleForget {
			delete(t.hosts, k)
		}
	}
}

// Usable reports whether a request to k would be sent now rather than
// skipped. It claims nothing: a request still goes through Admit.
func (t *Table) Usable(k Key) bool {
	if !t.remembers() {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.hosts[k]
	return h == nil || !h.down || (!h.probing && !t.now().Before(h.until))
}

// AnyUsable reports whether any of keys is Usable.
func (t *Table) AnyUsable(keys []Key) bool {
	for _, k := range keys {
		if t.Usable(k) {
			return true
		}
	}
	return false
}

// Request is one admitted request to a host. Report how it went, once for
// its response and again if its body then fails.
type Request struct {
	t     *Table
	key   Key
	trial bool // sent while the host was down: its result decides the state
	probe bool // holds the host's single probe
}

// Admit decides whether a request goes to k. A host marked down is skipped
// while its cooldown lasts; when the cooldown is over one request at a time
// probes it. mustTry sends the request anyway, for the last host a request
// can go to: memory alone never fails a pull. When skipped, the returned
// error says why.
func (t *Table) Admit(k Key, mustTry bool) (*Request, error) {
	if t == nil {
		return &Request{}, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	h := t.get(k, now)
	if !t.remembers() || !h.down {
		return &Request{t: t, key: k}, nil
	}
	r := &Request{t: t, key: k, trial: true}
	switch {
	case !h.probing && !now.Before(h.until):
		h.probing, r.probe = true, true
	case !mustTry:
		h.requests[Skipped]++
		return nil, &SkippedError{Host: k.Host, Since: h.since, LastError: h.lastError}
	}
	return r, nil
}

// NoteStorage records that k is where registry redirected a request: a
// CDN or object store serving the registry's blobs. It is tracked as a host
// of its own, so that its failures are not the registry's.
func (t *Table) NoteStorage(k, registry Key) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.get(k, t.now())
	if !slices.Contains(h.serves, registry) {
		h.serves = append(h.serves, registry)
		slices.SortFunc(h.serves, func(a, b Key) int { return strings.Compare(a.String(), b.String()) })
	}
}

// SkippedError is a request not sent because its host is marked down.
type SkippedError struct {
	Host      string
	Since     time.Time
	LastError string
}

func (e *SkippedError) Error() string {
	return fmt.Sprintf("not tried: marked down since %s after %s", e.Since.Format(time.TimeOnly), e.LastError)
}

// Report records how the request went; detail says what failed, for the
// host's last error. A request that was not admitted (nil) reports nothing.
func (r *Request) Report(ctx context.Context, o Outcome, detail string) {
	if r == nil || r.t == nil {
		return
	}
	r.t.report(ctx, r, o, detail)
}

func (t *Table) report(ctx context.Context, r *Request, o Outcome, detail string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	h := t.get(r.key, now)
	h.requests[o]++
	if r.probe {
		h.probing, r.probe = false, false
	}
	failed := false
	switch o {
	case OK, Answer:
		h.throttled = 0
	case Throttled:
		h.throttled++
		failed = h.throttled >= t.cfg.ThrottleLimit
	case ServerError, Unreachable, Timeout:
		failed = true
	default: // Canceled, Skipped: nothing learned
		return
	}
	if failed {
		h.lastError, h.lastErrAt = detail, now
	}
	if !t.remembers() {
		return
	}
	switch {
	case !failed && h.down && r.trial:
		h.down, h.failures, h.since = false, 0, now
		log.G(ctx).WithField("host", r.key.String()).Info("registry host is healthy again")
	case failed && !h.down:
		h.down, h.failures, h.since = true, 1, now
		h.until = now.Add(t.cfg.Cooldown)
		log.G(ctx).WithFields(log.Fields{
			"host": r.key.String(), "error": detail, "cooldown": t.cfg.Cooldown,
		}).Warn("registry host failed; skipping it for pulls during the cooldown")
	case failed && r.trial:
		// A probe, or a last-resort request, failed again: wait longer.
		h.failures++
		cd := t.cooldown(h.failures)
		h.until = now.Add(cd)
		log.G(ctx).WithFields(log.Fields{
			"host": r.key.String(), "error": detail, "cooldown": cd,
		}).Debug("registry host still failing")
	}
	// A request admitted before the host went down changes nothing: the
	// host is already marked, and one failure must not count many times.
}

// cooldown is the wait after n failures: Cooldown doubled n-1 times, at
// most MaxCooldown.
func (t *Table) cooldown(n int) time.Duration {
	d := t.cfg.Cooldown
	for i := 1; i < n && d < t.cfg.MaxCooldown; i++ {
		d *= 2
	}
	return min(d, t.cfg.MaxCooldown)
}

// Status is what the table knows of one host.
type Status struct {
	Key       Key
	Up        bool
	Probing   bool
	Since     time.Time // when it went up or down (or was first seen)
	NextProbe time.Time // while down: when a request may probe it
	Failures  int       // failed checks in a row while down
	LastError string
	LastErrAt time.Time
	Requests  map[Outcome]uint64
	// Serves lists, for a storage host (a CDN or object store a registry
	// redirected blob downloads to), those registries; empty for a
	// registry.
	Serves []Key
	// RetryAt is when a host that answered 429 may be asked again; zero
	// when it did not ask for a wait.
	RetryAt time.Time
}

// Hosts returns every host the table knows, sorted by key.
func (t *Table) Hosts() []Status {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Status, 0, len(t.hosts))
	for k, h := range t.hosts {
		s := Status{
			Key: k, Up: !h.down, Probing: h.probing, Since: h.since, Failures: h.failures,
			LastError: h.lastError, LastErrAt: h.lastErrAt, Requests: make(map[Outcome]uint64, len(h.requests)),
			Serves: slices.Clone(h.serves),
		}
		if h.retryAt.After(t.now()) {
			s.RetryAt = h.retryAt
		}
		if h.down {
			s.NextProbe = h.until
		}
		for o, n := range h.requests {
			s.Requests[o] = n
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}
