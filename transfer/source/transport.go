package source

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/lane"
)

// endpoint is one registry host of a pull, as hosts.toml lists it.
type endpoint struct {
	key  health.Key
	role string // "mirror" or "upstream"
	// later are the hosts containerd tries after this one for the same
	// request; a marked host is skipped only if one of them may be used.
	later []health.Key
}

// Roles of a host in a pull's host list: hosts.toml lists mirrors first and
// the server last.
const (
	roleMirror   = "mirror"
	roleUpstream = "upstream"
)

// hostTransport is the client transport of one registry host in one pull.
// It skips the host while the node's health table has it marked down,
// bounds the wait for headers and for body bytes, reports every outcome to
// the table and records what the host answered for the pull.
type hostTransport struct {
	next      http.RoundTripper
	rec       *Recorder
	table     *health.Table // nil: no memory, no timeouts
	downloads *lane.Lane    // nil: containerd's download limiter applies
	link      *lane.Link    // nil: bodies never pause for other pulls'
	ep        endpoint
}

// Errors a stalled host ends a request with. They are not net.Error
// timeouts on purpose: containerd repeats those on the last host, and the
// point is to bound the wait.
var (
	errNoResponse = errors.New("no response")
	errStalled    = errors.New("body stalled")
)

func (t *hostTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// A registry may answer a blob GET with a redirect to a CDN or an
	// object store, as Docker Hub, ECR and GCR do. The client follows it
	// through this transport, and the request that follows is the blob's
	// download all the same: it takes the place in the lane, and its bytes
	// are the blob's, counted for the host that redirected. Its host's
	// health is its own, though: a storage host that stalls is not the
	// registry failing, and the registry still serves manifests.
	first := origin(req)
	kind, repo, ref := parsePath(first.URL.Path)
	h := hostOf{key: t.ep.key}
	if first != req && req.URL.Host != t.ep.key.Host {
		h = hostOf{key: health.Key{Scheme: req.URL.Scheme, Host: req.URL.Host}, storage: true}
		t.table.NoteStorage(h.key, t.ep.key)
	}
	return t.send(req, first, h, kind, repo, ref)
}

// hostOf is the host a request goes to: the registry host of the
// transport, or the storage host it redirected to.
type hostOf struct {
	key     health.Key
	storage bool
}

// detail says what happened at the host, naming a storage host, which
// errors otherwise put under the registry that redirected to it.
func (h hostOf) detail(s string) string {
	if h.storage {
		return "storage " + h.key.Host + ": " + s
	}
	return s
}

// send makes the request to h, once the host gives it a turn; first is
// the request its redirects began with.
func (t *hostTransport) send(req, first *http.Request, h hostOf, kind, repo, ref string) (_ *http.Response, err error) {
	cfg := t.table.Config()
	// A download place is held from the request to the body's last round
	// trip (see place), as containerd's own limiter would be to its end.
	// An image config takes none: it is a few KiB, and containerd requests
	// none of the image's layers before it has it, so in an oldest-first
	// lane a young pull's config would wait for every older pull's layers,
	// and its own layers a round trip more once the link is free.
	needsPlace := kind == "blobs" && req.Method == http.MethodGet && t.downloads != nil && !t.rec.fetchWatch().isConfig(digest.Digest(ref))
	var download *place
	giveBack := func() {
		if download != nil {
			download.give()
			download = nil
		}
	}
	// The turn is asked for with the place held, so that a request that
	// waited in the lane still honours a 429 answered meanwhile, and the
	// request that retries a throttled host is one about to be sent.
	var answered func(health.Outcome, time.Duration)
	for asked := time.Now(); answered == nil; {
		if needsPlace {
			release, err := t.downloads.Acquire(req.Context())
			if err != nil {
				return nil, err
			}
			download = newPlace(release)
		}
		var wait func(context.Context) error
		answered, wait, err = t.table.Turn(h.key, asked)
		if err != nil {
			giveBack()
			t.rec.attempt(kind, ref, t.ep, health.Throttled, http.StatusTooManyRequests, h.detail(err.Error()))
			return nil, err
		}
		if answered == nil {
			// The lane serves other pulls while this one waits; the
			// place is taken again after, in the pull's order.
			giveBack()
			if err := wait(req.Context()); err != nil {
				return nil, err
			}
		}
	}
	// How the request went for the host's throttling, told on every way
	// out, or a retry the host is waiting for would never end.
	outcome, retry := health.Canceled, time.Duration(0)
	defer func() { answered(outcome, retry) }()

	mustTry := len(t.ep.later) == 0 || !t.table.AnyUsable(t.ep.later)
	admitted, err := t.table.Admit(h.key, mustTry)
	if err != nil {
		giveBack()
		outcome = health.Skipped
		t.rec.attempt(kind, ref, t.ep, health.Skipped, 0, h.detail(err.Error()))
		return nil, err
	}

	ctx, cancel := context.WithCancelCause(req.Context())
	stopWait := watch(cancel, cfg.ResponseTimeout, fmt.Errorf("%w within %s", errNoResponse, cfg.ResponseTimeout))
	sent := time.Now()
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	stopWait()
	if err != nil {
		giveBack()
		err = causeOf(ctx, err)
		cancel(nil)
		outcome = classifyErr(req.Context(), err)
		admitted.Report(req.Context(), outcome, describeErr(err))
		t.rec.attempt(kind, ref, t.ep, outcome, 0, h.detail(describeErr(err)))
		return nil, err
	}
	o := classifyStatus(resp.StatusCode)
	outcome = o
	asked := time.Duration(0)
	if resp.StatusCode >= 400 {
		asked = retryAfter(resp.Header.Get("Retry-After"))
	}
	if o == health.Throttled {
		retry = asked
	}
	admitted.Report(req.Context(), o, resp.Status)
	if !isRedirect(resp) {
		// A redirect serves nothing yet: the request it leads to is what
		// the pull got, or did not get, from this host.
		t.rec.attempt(kind, ref, t.ep, o, resp.StatusCode, h.detail(resp.Status))
	}
	if resp.StatusCode >= 400 {
		t.rec.noteRetryAfter(asked)
		resp.Body = &watchedBody{ReadCloser: resp.Body, cancel: cancel, download: download}
		return resp, nil
	}
	if isRedirect(resp) {
		// Its body is not the blob, and the client closes it before it
		// follows, which gives the place back for the request that follows
		// to take again.
		if resp.Request == nil {
			resp.Request = req // for origin; http.Transport sets it
		}
		resp.Body = &watchedBody{ReadCloser: resp.Body, cancel: cancel, download: download}
		return resp, nil
	}
	if download != nil {
		download.answered(time.Since(sent), resp.ContentLength)
	}
	body := &watchedBody{ReadCloser: resp.Body, cancel: cancel, ctx: ctx, parent: req.Context(), timeout: cfg.ReadTimeout, download: download}
	if download != nil && t.link != nil {
		body.flow, body.places = t.link.Open(req.Context(), t.downloads), t.downloads
	}
	if cfg.ReadTimeout > 0 {
		// Made here, stopped, rather than in the first Read: Close may run
		// concurrently with a Read to abort it.
		body.timer = time.AfterFunc(cfg.ReadTimeout, func() {
			cancel(fmt.Errorf("%w: no bytes for %s", errStalled, cfg.ReadTimeout))
		})
		body.timer.Stop()
	}
	body.failed = func(err error) {
		o, detail := classifyErr(req.Context(), err), describeErr(err)
		admitted.Report(req.Context(), o, detail)
		t.rec.attempt(kind, ref, t.ep, o, 0, h.detail(detail))
	}
	switch kind {
	case "manifests":
		t.rec.manifest(first.URL.Host, repo, ref)
		if t.rec.fetchWatch() != nil && req.Method == http.MethodGet {
			tee := &manifestTee{}
			body.tee = tee.add
			body.eof = func() { t.rec.manifestBody(tee.buf.Bytes()) }
		}
	case "blobs":
		if req.Method == http.MethodGet {
			// Bytes are counted as the body is read, since a fetch may stop
			// early or resume with a range request.
			body.add = t.rec.blob(first.URL.Host, ref)
		}
	}
	resp.Body = body
	return resp, nil
}

// origin is the request a chain of redirects began with: http.Client makes
// a new request for each redirect, whose Response is the answer that led
// to it.
func origin(req *http.Request) *http.Request {
	for req.Response != nil && req.Response.Request != nil {
		req = req.Response.Request
	}
	return req
}

// isRedirect reports an answer http.Client follows by itself.
func isRedirect(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return resp.Header.Get("Location") != ""
	}
	return false
}

// wrap returns c with its transport going through hostTransport.
func (r *Recorder) wrap(c *http.Client, h Hosts, ep endpoint) *http.Client {
	if c == nil {
		c = &http.Client{}
	}
	wrapped := *c
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	wrapped.Transport = &hostTransport{next: next, rec: r, table: h.Health, downloads: h.Downloads, link: h.Link, ep: ep}
	return &wrapped
}

// watch cancels with cause unless the returned stop is called within d.
// A zero d watches nothing.
func watch(cancel context.CancelCauseFunc, d time.Duration, cause error) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	t := time.AfterFunc(d, func() { cancel(cause) })
	return func() { t.Stop() }
}

// causeOf returns the stall that cancelled ctx in place of the transport's
// plain "context canceled".
func causeOf(ctx context.Context, err error) error {
	if c := context.Cause(ctx); errors.Is(c, errNoResponse) || errors.Is(c, errStalled) {
		return c
	}
	return err
}

func classifyStatus(code int) health.Outcome {
	switch {
	case code < 400:
		return health.OK
	case code == http.StatusTooManyRequests:
		return health.Throttled
	case code >= 500:
		return health.ServerError
	}
	return health.Answer
}

func classifyErr(parent context.Context, err error) health.Outcome {
	var netErr net.Error
	switch {
	case parent.Err() != nil:
		return health.Canceled
	case errors.Is(err, errNoResponse), errors.Is(err, errStalled):
		return health.Timeout
	case errors.As(err, &netErr) && netErr.Timeout():
		return health.Timeout
	}
	return health.Unreachable
}

// describeErr is what a failed request says about its host: the cause
// without the request URL, which may carry tokens in its query.
func describeErr(err error) string {
	var u *url.Error
	if errors.As(err, &u) {
		err = u.Err
	}
	var tlsErr *tls.CertificateVerificationError
	if errors.As(err, &tlsErr) {
		return "tls: " + tlsErr.Err.Error()
	}
	return err.Error()
}

// watchedBody bounds how long one Read may wait for bytes, counts blob
// bytes, and ends the request's context when closed. Only time spent
// inside Read counts: a consumer that pauses (a slow disk, the download
// limiter) is not the registry stalling.
type watchedBody struct {
	io.ReadCloser
	cancel   context.CancelCauseFunc
	ctx      context.Context // the request's own, cancelled on a stall
	parent   context.Context // the caller's
	timeout  time.Duration
	add      func(int64)  // blob byte counter, or nil
	tee      func([]byte) // sees every byte read, or nil
	download *place       // the download place, or nil
	flow     *lane.Flow   // the body on the node's link, with download; or nil
	places   *lane.Lane   // where download is taken again after a pause
	paused   bool         // yielding the link; only the reader reads it
	eof      func()       // called at the end of a complete body, or nil
	failed   func(error)  // reports a body failure
	once     sync.Once
	timer    *time.Timer
}

func (b *watchedBody) Read(p []byte) (int, error) {
	if err := b.yield(); err != nil {
		return 0, err
	}
	if b.paused {
		p = p[:min(len(p), trickle)]
	}
	if b.timer != nil {
		b.timer.Reset(b.timeout)
	}
	n, err := b.ReadCloser.Read(p)
	if b.timer != nil {
		b.timer.Stop()
	}
	if n > 0 && b.add != nil {
		b.add(int64(n))
	}
	if n > 0 && b.download != nil {
		b.download.advance(n)
	}
	if n > 0 && b.flow != nil {
		b.flow.Moved()
	}
	if n > 0 && b.tee != nil {
		b.tee(p[:n])
	}
	if err == io.EOF && b.eof != nil {
		b.eof()
		b.eof = nil
	}
	if err == nil || err == io.EOF || b.failed == nil || b.parent.Err() != nil {
		return n, err
	}
	// The host cut the body off or stopped sending. Mark it, and tell
	// containerd in the one word that makes it resume where it stopped
	// (a Range request, which the health table now sends to the next
	// host). A later Read of this body fails the same way.
	b.once.Do(func() { b.failed(causeOf(b.ctx, err)) })
	return n, io.ErrUnexpectedEOF
}

func (b *watchedBody) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.eof != nil {
		// A reader that stops at the expected size never sees EOF; a
		// body cut short does not parse.
		b.eof()
		b.eof = nil
	}
	err := b.ReadCloser.Close()
	b.cancel(nil)
	if b.download != nil {
		b.download.close()
	}
	if b.flow != nil {
		b.flow.Close()
	}
	return err
}

// yield pauses the body while a pull that would finish well before its
// own is downloading (lane.Link), with its download place given back so
// that pull's requests can take it, and takes a place again after, in
// its pull's order. A body in its last round trip, its place given back
// already, reads on. The pause is not the host stalling: no timer runs.
//
// A paused body still reads a little every trickleEvery: a sender, or a
// proxy between, whose writes block for long takes the connection for
// dead (nginx's send_timeout is 60 s).
func (b *watchedBody) yield() error {
	if b.flow == nil {
		return nil
	}
	if !b.paused {
		if !b.flow.Ask() || !b.download.held() {
			return nil
		}
		b.download.give()
		b.paused = true
	}
	behind, err := b.flow.Yield(b.ctx, trickleEvery)
	if err != nil || behind {
		return err
	}
	release, err := b.places.Acquire(b.ctx)
	if err != nil {
		return err
	}
	b.download.retake(release)
	b.paused = false
	return nil
}

// trickleEvery is how often a paused body reads, and trickle how much.
const (
	trickleEvery = 5 * time.Second
	trickle      = 4 << 10
)
