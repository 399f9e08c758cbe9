package hostclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/lane"
)

// transport is the client transport of one registry host in one pull.
type transport struct {
	next http.RoundTripper
	node Node
	ep   Endpoint
	obs  Observer
}

// Errors a stalled host ends a request with. They are not net.Error
// timeouts on purpose: containerd repeats those on the last host, and the
// point is to bound the wait.
var (
	errNoResponse = errors.New("no response")
	errStalled    = errors.New("body stalled")
)

// request is one request of a pull, to the host it goes to.
type request struct {
	*http.Request
	first           *http.Request // the request its redirects began with
	host            hostOf
	kind, repo, ref string // from the first request's path (parsePath)
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

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	// A registry may answer a blob GET with a redirect to a CDN or an
	// object store, as Docker Hub, ECR and GCR do. The client follows it
	// through this transport, and the request that follows is the blob's
	// download all the same: it takes the place in the lane, and its bytes
	// are the blob's, counted for the host that redirected. Its host's
	// health is its own, though: a storage host that stalls is not the
	// registry failing, and the registry still serves manifests.
	r := request{Request: req, first: origin(req), host: hostOf{key: t.ep.Key}}
	r.kind, r.repo, r.ref = parsePath(r.first.URL.Path)
	if r.first != req && req.URL.Host != t.ep.Key.Host {
		r.host = hostOf{key: health.Key{Scheme: req.URL.Scheme, Host: req.URL.Host}, storage: true}
		t.node.Health.NoteStorage(r.host.key, t.ep.Key)
	}
	return t.send(r)
}

// send makes the request once the host gives it a turn and admits it, and
// hands its answer on with a body that reports what it reads.
func (t *transport) send(r request) (*http.Response, error) {
	download, answered, err := t.turn(r)
	if err != nil {
		return nil, err
	}
	// How the request went for the host's throttling, told on every way
	// out, or a retry the host is waiting for would never end.
	outcome, retry := health.Canceled, time.Duration(0)
	defer func() { answered(outcome, retry) }()

	admitted, err := t.admit(r)
	if err != nil {
		download.give()
		outcome = health.Skipped
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	sent := time.Now()
	resp, err := t.headers(ctx, cancel, r)
	if err != nil {
		download.give()
		cancel(nil)
		outcome = classifyErr(r.Context(), err)
		admitted.Report(r.Context(), outcome, describeErr(err))
		t.attempted(r, outcome, 0, describeErr(err))
		return nil, err
	}
	outcome, retry = t.answered(r, admitted, resp)
	if resp.StatusCode >= 400 || isRedirect(resp) {
		// Not the blob: the place goes back when the client closes the
		// body, which it does before it follows a redirect, for the
		// request that follows to take again.
		if resp.Request == nil {
			resp.Request = r.Request // for origin; http.Transport sets it
		}
		resp.Body = &body{ReadCloser: resp.Body, cancel: cancel, download: download}
		return resp, nil
	}
	download.answered(time.Since(sent), resp.ContentLength)
	resp.Body = t.body(ctx, cancel, r, resp, download, admitted, sent)
	return resp, nil
}

// turn waits for the host's turn (health.Table.Turn: a throttled host's
// requests wait for its Retry-After), with a download place when the
// request needs one. The turn is asked for with the place held, so that a
// request that waited in the lane still honours a 429 answered meanwhile,
// and the request that retries a throttled host is one about to be sent.
func (t *transport) turn(r request) (*place, func(health.Outcome, time.Duration), error) {
	for asked := time.Now(); ; {
		var download *place
		if t.needsPlace(r) {
			ticket, start := lane.TicketOf(r.Context()), time.Now()
			release, err := t.node.Downloads.Acquire(r.Context())
			ticket.Waited(lane.WaitDownload, time.Since(start))
			if err != nil {
				return nil, nil, err
			}
			download = newPlace(release)
			// Given back at once if the body would pause: a request is not
			// sent to wait (lane.Link.Unasked).
			if next := t.node.Link.Unasked(r.Context(), t.node.Downloads); next != nil && next.Behind() {
				download.give()
				start := time.Now()
				err := next.Wait(r.Context())
				ticket.Waited(lane.WaitLink, time.Since(start))
				if err != nil {
					return nil, nil, err
				}
				continue
			}
		}
		answered, wait, err := t.node.Health.Turn(r.host.key, asked)
		if err != nil {
			download.give()
			t.attempted(r, health.Throttled, http.StatusTooManyRequests, err.Error())
			return nil, nil, err
		}
		if answered != nil {
			return download, answered, nil
		}
		// The lane serves other pulls while this one waits; the place is
		// taken again after, in the pull's order.
		download.give()
		if err := wait(r.Context()); err != nil {
			return nil, nil, err
		}
	}
}

// needsPlace reports a blob download, which holds a download place from
// its request to the body's last round trip (see place), as containerd's
// own limiter would to its end. An image config takes none: in an
// oldest-first lane a young pull's config would wait for every older
// pull's layers, and its own layers a round trip more once the link is
// free.
func (t *transport) needsPlace(r request) bool {
	return r.kind == "blobs" && r.Method == http.MethodGet && t.node.Downloads != nil && !t.obs.IsConfig(digest.Digest(r.ref))
}

// admit asks the health table whether the host may be tried: a host marked
// down is skipped while a later one may be used.
func (t *transport) admit(r request) (*health.Request, error) {
	mustTry := len(t.ep.Later) == 0 || !t.node.Health.AnyUsable(t.ep.Later)
	admitted, err := t.node.Health.Admit(r.host.key, mustTry)
	if err != nil {
		t.attempted(r, health.Skipped, 0, err.Error())
	}
	return admitted, err
}

// headers sends the request and waits for the answer's headers, within the
// table's response timeout.
func (t *transport) headers(ctx context.Context, cancel context.CancelCauseFunc, r request) (*http.Response, error) {
	d := t.node.Health.Config().ResponseTimeout
	stop := watch(cancel, d, fmt.Errorf("%w within %s", errNoResponse, d))
	resp, err := t.next.RoundTrip(r.WithContext(ctx))
	stop()
	if err != nil {
		return nil, causeOf(ctx, err)
	}
	return resp, nil
}

// answered reports the answer to the health table and the observer, and
// returns how it went for the host's throttling.
func (t *transport) answered(r request, admitted *health.Request, resp *http.Response) (health.Outcome, time.Duration) {
	o := classifyStatus(resp.StatusCode)
	admitted.Report(r.Context(), o, resp.Status)
	if !isRedirect(resp) {
		// A redirect serves nothing yet: the request it leads to is what
		// the pull got, or did not get, from this host.
		t.attempted(r, o, resp.StatusCode, resp.Status)
	}
	if resp.StatusCode < 400 {
		return o, 0
	}
	asked := retryAfter(resp.Header.Get("Retry-After"))
	if asked > 0 {
		t.obs.AskedToWait(asked)
	}
	if o != health.Throttled {
		asked = 0
	}
	return o, asked
}

// body wraps a served answer's body: bounded reads, the download place,
// the link, and what the observer counts of it.
func (t *transport) body(ctx context.Context, cancel context.CancelCauseFunc, r request, resp *http.Response, download *place, admitted *health.Request, sent time.Time) *body {
	timeout := t.node.Health.Config().ReadTimeout
	b := &body{ReadCloser: resp.Body, cancel: cancel, ctx: ctx, parent: r.Context(), timeout: timeout, download: download}
	if download != nil && t.node.Link != nil {
		b.flow, b.places = t.node.Link.Open(r.Context(), t.node.Downloads), t.node.Downloads
		// Made at debug level only: it is told of every Read.
		if log.G(r.Context()).Logger.IsLevelEnabled(log.DebugLevel) {
			b.read = &bodyRead{blob: r.ref, sent: sent}
		}
	}
	if timeout > 0 {
		// Made here, stopped, rather than in the first Read: Close may run
		// concurrently with a Read to abort it.
		b.timer = time.AfterFunc(timeout, func() {
			cancel(fmt.Errorf("%w: no bytes for %s", errStalled, timeout))
		})
		b.timer.Stop()
	}
	b.failed = func(err error) {
		o, detail := classifyErr(r.Context(), err), describeErr(err)
		admitted.Report(r.Context(), o, detail)
		t.attempted(r, o, 0, detail)
	}
	switch r.kind {
	case "manifests":
		if whole := t.obs.Manifest(r.first.URL.Host, r.repo, r.ref, r.Method == http.MethodGet); whole != nil {
			tee := &manifestTee{}
			b.tee = tee.add
			b.eof = func() { whole(tee.buf.Bytes()) }
		}
	case "blobs":
		if r.Method == http.MethodGet {
			// Bytes are counted as the body is read, since a fetch may stop
			// early or resume with a range request.
			b.add = t.obs.Blob(servedBy(resp, r.first.URL.Host), r.ref)
			if t.node.Arrivals != nil {
				if offset, size, ok := span(resp); ok {
					b.share = t.node.Arrivals.Arriving(digest.Digest(r.ref), offset, size)
				}
			}
		}
	}
	return b
}

// span is where a blob body starts in its blob, and the blob's size (-1
// unknown): a 200 is the whole blob, a 206 says in its Content-Range.
func span(resp *http.Response) (offset, size int64, ok bool) {
	switch resp.StatusCode {
	case http.StatusOK:
		return 0, resp.ContentLength, true
	case http.StatusPartialContent:
		// "bytes first-last/size", size possibly "*".
		var first, last int64
		var total string
		if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes %d-%d/%s", &first, &last, &total); err != nil {
			return 0, 0, false
		}
		size, err := strconv.ParseInt(total, 10, 64)
		if err != nil {
			size = -1
		}
		return first, size, true
	}
	return 0, 0, false
}

// servedBy is who served resp: the peer its host names, or host.
func servedBy(resp *http.Response, host string) string {
	if p := resp.Header.Get(PeerHeader); p != "" {
		return PeerPrefix + p
	}
	return host
}

// attempted tells the observer how a request went.
func (t *transport) attempted(r request, o health.Outcome, status int, detail string) {
	t.obs.Attempted(Attempt{Kind: r.kind, Ref: r.ref, Endpoint: t.ep, Outcome: o, Status: status, Detail: r.host.detail(detail)})
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
