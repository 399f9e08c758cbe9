package source

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/hostclient"
	"github.com/pullwise/pullwise/transfer/lane"
)

// blobHost is a registry host that serves one blob, with Range support, and
// counts what it was asked for.
type blobHost struct {
	*httptest.Server
	blob []byte
	// serve, when set, answers instead of serving the blob.
	serve    func(w http.ResponseWriter, r *http.Request) bool
	requests atomic.Int64
	mu       sync.Mutex
	ranges   []string
}

func newBlobHost(t *testing.T, blob []byte) *blobHost {
	h := &blobHost{blob: blob}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.requests.Add(1)
		h.mu.Lock()
		h.ranges = append(h.ranges, r.Header.Get("Range"))
		h.mu.Unlock()
		if h.serve != nil && h.serve(w, r) {
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(h.blob))
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *blobHost) host() string { return strings.TrimPrefix(h.URL, "http://") }

// hostsDir writes a hosts.toml naming mirror in front of upstream.
func hostsDir(t *testing.T, upstream, mirror *blobHost) string {
	dir := t.TempDir()
	d := filepath.Join(dir, upstream.host())
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", upstream.URL, mirror.URL)
	if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fetch reads the blob through containerd's resolver as a pull would.
func fetch(ctx context.Context, t *testing.T, table *health.Table, dir string, upstream *blobHost) ([]byte, *Recorder, error) {
	t.Helper()
	rec := &Recorder{}
	r := NewResolver(ctx, Hosts{Dirs: []string{dir}, Health: table}, rec)
	ref := upstream.host() + "/team/app:v1"
	f, err := r.Fetcher(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(upstream.blob), Size: int64(len(upstream.blob))}
	rc, err := f.Fetch(ctx, desc)
	if err != nil {
		return nil, rec, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return b, rec, err
}

func hostStatus(t *testing.T, table *health.Table, h *blobHost) health.Status {
	t.Helper()
	for _, s := range table.Hosts() {
		if s.Key.Host == h.host() {
			return s
		}
	}
	t.Fatalf("%s not in the health table", h.host())
	return health.Status{}
}

func testTable(cfg health.Config) *health.Table {
	if cfg.Cooldown == 0 {
		cfg.Cooldown = time.Minute
	}
	return health.New(cfg)
}

func TestMarkedMirrorIsSkippedAcrossPulls(t *testing.T) {
	blob := bytes.Repeat([]byte("x"), 1000)
	upstream, mirror := newBlobHost(t, blob), newBlobHost(t, nil)
	mirror.serve = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return true
	}
	dir := hostsDir(t, upstream, mirror)
	table := testTable(health.Config{})
	for i := range 4 {
		got, _, err := fetch(context.Background(), t, table, dir, upstream)
		if err != nil || !bytes.Equal(got, blob) {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	if n := mirror.requests.Load(); n != 1 {
		t.Fatalf("a 503 mirror got %d requests in 4 pulls, want 1", n)
	}
}

func TestBlobCutOnMirrorResumesOnUpstream(t *testing.T) {
	blob := make([]byte, 256<<10)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	const cut = 100 << 10
	upstream, mirror := newBlobHost(t, blob), newBlobHost(t, blob)
	mirror.serve = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
		w.WriteHeader(http.StatusOK)
		w.Write(blob[:cut])
		panic(http.ErrAbortHandler)
	}
	table := testTable(health.Config{})
	got, _, err := fetch(context.Background(), t, table, hostsDir(t, upstream, mirror), upstream)
	if err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("fetch: %v (%d bytes)", err, len(got))
	}
	// The rest came from upstream in one range request: nothing twice.
	if want := []string{fmt.Sprintf("bytes=%d-", cut)}; fmt.Sprint(upstream.ranges) != fmt.Sprint(want) {
		t.Fatalf("upstream ranges %q, want %q", upstream.ranges, want)
	}
	if n := mirror.requests.Load(); n != 1 {
		t.Fatalf("mirror asked %d times, want once", n)
	}
	if s := hostStatus(t, table, mirror); s.Up {
		t.Fatalf("mirror %+v: want it down", s)
	}
}

func TestStalledHosts(t *testing.T) {
	blob := bytes.Repeat([]byte("y"), 64<<10)
	for _, tc := range []struct {
		name string
		// stall blocks the mirror's answer: before headers or mid-body.
		stall func(w http.ResponseWriter, r *http.Request, release <-chan struct{})
		want  string
	}{
		{"no headers", func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}, "no response within 200ms"},
		{"body stops", func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			w.WriteHeader(http.StatusOK)
			w.Write(blob[:1000])
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}, "body stalled: no bytes for 200ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			upstream, mirror := newBlobHost(t, blob), newBlobHost(t, blob)
			mirror.serve = func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodGet {
					tc.stall(w, r, release)
					return true
				}
				return false
			}
			table := testTable(health.Config{ResponseTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
			got, _, err := fetch(context.Background(), t, table, hostsDir(t, upstream, mirror), upstream)
			if err != nil || !bytes.Equal(got, blob) {
				t.Fatalf("fetch: %v", err)
			}
			s := hostStatus(t, table, mirror)
			if s.Up || s.LastError != tc.want {
				t.Fatalf("mirror status %+v, want down with %q", s, tc.want)
			}
		})
	}
}

// TestSlowReaderIsNotAStall: time the consumer spends between reads is not
// the registry's.
func TestSlowReaderIsNotAStall(t *testing.T) {
	blob := bytes.Repeat([]byte("z"), 8<<10)
	upstream := newBlobHost(t, blob)
	const readTimeout = 50 * time.Millisecond
	table := testTable(health.Config{ReadTimeout: readTimeout})
	rec := &Recorder{}
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{Health: table}, hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: upstream.host(), Path: "/v2"}, Role: hostclient.RoleUpstream}, rec.observer())
	resp, err := c.Get(upstream.URL + "/v2/team/app/blobs/sha256:z")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []byte
	buf := make([]byte, 1024)
	for {
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		if len(got) >= 3<<10 {
			break
		}
		// The consumer is slow, on purpose: real time, twice the read
		// timeout, passes between two reads. The read timeout is a
		// time.AfterFunc in the transport, which takes no clock, so only
		// real time can show that it does not run between reads.
		time.Sleep(2 * readTimeout)
	}
	if !table.Hosts()[0].Up {
		t.Fatal("a slow reader marked the host down")
	}
}

func TestAllHostsFailed(t *testing.T) {
	blob := []byte("blob")
	status := func(code int) func(w http.ResponseWriter, r *http.Request) bool {
		return func(w http.ResponseWriter, r *http.Request) bool {
			http.Error(w, http.StatusText(code), code)
			return true
		}
	}
	for _, tc := range []struct {
		name             string
		mirror, upstream func(w http.ResponseWriter, r *http.Request) bool
		upstreamDead     bool
		want             error
		text             string
	}{
		{"503 and refused", status(503), nil, true, errdefs.ErrUnavailable,
			"mirror MIRROR: 503 Service Unavailable; upstream UPSTREAM: dial tcp UPSTREAM: connect: connection refused"},
		{"all 404", status(404), status(404), false, errdefs.ErrNotFound,
			"mirror MIRROR: 404 Not Found; upstream UPSTREAM: 404 Not Found"},
		{"503 and 404", status(503), status(404), false, errdefs.ErrUnavailable,
			"mirror MIRROR: 503 Service Unavailable; upstream UPSTREAM: 404 Not Found"},
		{"401", status(404), status(401), false, errdefs.ErrUnauthenticated,
			"mirror MIRROR: 404 Not Found; upstream UPSTREAM: 401 Unauthorized"},
		{"403", status(500), status(403), false, errdefs.ErrPermissionDenied,
			"mirror MIRROR: 500 Internal Server Error; upstream UPSTREAM: 403 Forbidden"},
		{"429", status(503), status(429), false, errdefs.ErrResourceExhausted,
			"mirror MIRROR: 503 Service Unavailable; upstream UPSTREAM: 429 Too Many Requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstream, mirror := newBlobHost(t, blob), newBlobHost(t, blob)
			mirror.serve, upstream.serve = tc.mirror, tc.upstream
			dir := hostsDir(t, upstream, mirror)
			upHost := upstream.host()
			if tc.upstreamDead {
				// Keep the hosts.toml naming upstream's address, then take it
				// away: the connection is refused.
				upstream.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, rec, err := fetch(ctx, t, testTable(health.Config{}), dir, upstream)
			if err == nil {
				t.Fatal("fetch succeeded")
			}
			f := rec.Failure(upHost + "/team/app:v1")
			if f == nil {
				t.Fatalf("no failure explained for %v", err)
			}
			want := "all registries failed for " + upHost + "/team/app:v1: " +
				strings.NewReplacer("MIRROR", mirror.host(), "UPSTREAM", upHost).Replace(tc.text)
			if f.Error() != want {
				t.Fatalf("error\n got %s\nwant %s", f, want)
			}
			if !errors.Is(f, tc.want) {
				t.Fatalf("%v is not %v", f, tc.want)
			}
		})
	}
}

func TestFailureIsNilWhenARegistryServed(t *testing.T) {
	blob := []byte("blob")
	upstream, mirror := newBlobHost(t, blob), newBlobHost(t, blob)
	mirror.serve = func(w http.ResponseWriter, r *http.Request) bool {
		http.NotFound(w, r) // a mirror without the repository
		return true
	}
	table := testTable(health.Config{})
	if _, rec, err := fetch(context.Background(), t, table, hostsDir(t, upstream, mirror), upstream); err != nil || rec.Failure("x") != nil {
		t.Fatalf("fetch %v, failure %v", err, rec.Failure("x"))
	}
	// A 404 is an answer: the mirror stays up.
	for _, s := range table.Hosts() {
		if !s.Up {
			t.Fatalf("%s marked down by a 404", s.Key)
		}
	}
}

func TestErrorsCarryNoCredentials(t *testing.T) {
	rec := &Recorder{}
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{}, hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: "127.0.0.1:1", Path: "/v2"}, Role: hostclient.RoleUpstream}, rec.observer())
	_, err := c.Get("http://user:s3cret@127.0.0.1:1/v2/team/app/manifests/v1?token=s3cret")
	if err == nil {
		t.Fatal("request to a closed port succeeded")
	}
	f := rec.Failure("127.0.0.1:1/team/app:v1")
	if f == nil || strings.Contains(f.Error(), "s3cret") {
		t.Fatalf("failure %v", f)
	}
}

// TestDownloadPlaceHeldUntilBodyCloses: with a download lane, a blob GET
// holds a place from the request to the end of its body; answers that fail
// give it back too.
func TestDownloadPlaceHeldUntilBodyCloses(t *testing.T) {
	blob := []byte("layer bytes")
	h := newBlobHost(t, blob)
	downloads := lane.New(1)
	rec := &Recorder{}
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{Downloads: downloads}, hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: h.host(), Path: "/v2"}, Role: hostclient.RoleUpstream}, rec.observer())
	url := h.URL + "/v2/team/app/blobs/" + digest.FromBytes(blob).String()

	first, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		second <- err
	}()
	await.Until(t, 10*time.Second, "the second download to wait for a place", func() bool { return downloads.Waiting() == 1 })
	select {
	case err := <-second:
		t.Fatalf("second download ran while the first held the only place: %v", err)
	default:
	}
	io.Copy(io.Discard, first.Body)
	first.Body.Close()
	if err := <-second; err != nil {
		t.Fatal(err)
	}

	// A failed answer gives its place back when its body is closed.
	h.serve = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return true
	}
	for range 3 {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
}

// TestLargePullGivesWayToSmallOne: with every download place held by a
// large pull's body, a small pull asked for with it waits for a place.
// The large body pauses, gives its place to the small pull, whose body is
// in first, and then goes on to its end with every byte, leaving no place
// taken (lane.Link).
func TestLargePullGivesWayToSmallOne(t *testing.T) {
	blob := bytes.Repeat([]byte("layer bytes "), 1<<17)
	h := newBlobHost(t, blob)
	downloads := lane.New(1)
	rec := &Recorder{}
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{Downloads: downloads, Link: lane.NewLink(time.Second)}, hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: h.host(), Path: "/v2"}, Role: hostclient.RoleUpstream}, rec.observer())
	url := h.URL + "/v2/team/app/blobs/" + digest.FromBytes(blob).String()
	get := func(bytes int64) (*http.Response, error) {
		ticket := lane.NewTicket(time.Now())
		ticket.Need(costOf(bytes))
		req, err := http.NewRequestWithContext(lane.WithTicket(context.Background(), ticket), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Do(req)
	}

	large, err := get(1700 << 20)
	if err != nil {
		t.Fatal(err)
	}
	smallDone := make(chan error, 1)
	go func() {
		resp, err := get(20 << 20)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		smallDone <- err
	}()
	await.Until(t, 10*time.Second, "the small pull to wait for a place", func() bool { return downloads.Waiting() == 1 })
	largeDone := make(chan []byte, 1)
	go func() {
		got, err := io.ReadAll(large.Body)
		if err != nil {
			t.Error(err)
		}
		large.Body.Close()
		largeDone <- got
	}()
	select {
	case err := <-smallDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-largeDone:
		t.Fatal("the large body was read to its end before the small pull got a place")
	}
	if got := <-largeDone; !bytes.Equal(got, blob) {
		t.Fatalf("large body: %d bytes, want the blob's %d", len(got), len(blob))
	}
	release, err := downloads.Acquire(context.Background())
	if err != nil || downloads.Waiting() != 0 {
		t.Fatalf("a place leaked: %v", err)
	}
	release()
}

// TestRedirectedBlobDownload: a registry that redirects blob GETs to a CDN,
// as Docker Hub, ECR and GCR do. The CDN request is the blob's download: it
// holds the lane's place, and its bytes are the blob's, for the registry
// that redirected.
func TestRedirectedBlobDownload(t *testing.T) {
	blob := []byte("layer bytes, served by the CDN")
	cdn := newBlobHost(t, blob)
	reg := newBlobHost(t, nil)
	reg.serve = func(w http.ResponseWriter, r *http.Request) bool {
		http.Redirect(w, r, cdn.URL+"/store/"+path.Base(r.URL.Path)+"?signature=s3cret", http.StatusTemporaryRedirect)
		return true
	}
	downloads := lane.New(1)
	rec := &Recorder{}
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{Downloads: downloads}, hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: reg.host(), Path: "/v2"}, Role: hostclient.RoleUpstream}, rec.observer())
	url := reg.URL + "/v2/team/app/blobs/" + digest.FromBytes(blob).String()

	first, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		resp, err := c.Get(url)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		second <- err
	}()
	await.Until(t, 10*time.Second, "the second download to wait for a place", func() bool {
		if cdn.requests.Load() > 1 {
			t.Fatal("a second blob download reached the CDN while the first held the only place")
		}
		return downloads.Waiting() == 1
	})
	if _, err := io.Copy(io.Discard, first.Body); err != nil {
		t.Fatal(err)
	}
	first.Body.Close()
	if err := <-second; err != nil {
		t.Fatal(err)
	}

	got := rec.Result("").Blobs
	want := map[string]BlobStats{reg.host(): {Blobs: 2, Bytes: 2 * int64(len(blob))}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("blob stats = %v, want %v: the CDN's bytes, counted once, for the registry", got, want)
	}
	if n := cdn.requests.Load(); n != 2 {
		t.Fatalf("CDN requests = %d, want 2", n)
	}
}

// TestDownloadPlaceGivenBackForTheLastRoundTrip: over a link with a round
// trip, the next blob request goes out while the body before it has less
// than a round trip's worth of bytes left, not after its end, and not
// earlier.
func TestDownloadPlaceGivenBackForTheLastRoundTrip(t *testing.T) {
	const (
		rtt   = 50 * time.Millisecond
		size  = 256 << 10
		chunk = 8 << 10
		// 1.6 MiB/s: a round trip carries 80 KiB, under a third of the body.
		pace = 5 * time.Millisecond
		// The server holds the last 40 KiB of the first body until the
		// second request comes.
		held = size - 40<<10
	)
	blob := bytes.Repeat([]byte("l"), size)
	more := make(chan struct{})
	second := make(chan struct{})
	var firstDone atomic.Bool
	h := newBlobHost(t, blob)
	// The server plays a link with a round trip and a rate in real time:
	// the transport times the answer and the body's bytes with the real
	// clock and takes no other, so the sleeps below are the link.
	h.serve = func(w http.ResponseWriter, r *http.Request) bool {
		if h.requests.Load() > 1 {
			close(second)
			if !firstDone.Load() {
				w.Write([]byte("second"))
			}
			return true
		}
		time.Sleep(rtt)
		w.Header().Set("Content-Length", fmt.Sprint(size))
		w.Write(blob[:chunk])
		w.(http.Flusher).Flush()
		<-more
		for off := chunk; off < size; off += chunk {
			if off == held {
				select {
				case <-second:
				case <-time.After(10 * time.Second):
					t.Error("the next request did not go out while the body had its last round trip left")
				}
			}
			time.Sleep(pace)
			w.Write(blob[off : off+chunk])
			w.(http.Flusher).Flush()
		}
		return true
	}
	downloads := lane.New(1)
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{Downloads: downloads}, hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: h.host(), Path: "/v2"}, Role: hostclient.RoleUpstream}, (&Recorder{}).observer())
	url := h.URL + "/v2/team/app/blobs/" + digest.FromBytes(blob).String()

	first, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	got := make(chan string, 1)
	go func() {
		resp, err := c.Get(url)
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- string(b)
	}()
	await.Until(t, 10*time.Second, "the second request to wait for a place", func() bool { return downloads.Waiting() == 1 })
	// What came with the headers says nothing of the rate: the place is
	// kept.
	buf := make([]byte, size)
	n, err := first.Body.Read(buf)
	if err != nil || n == 0 {
		t.Fatalf("first read: %d, %v", n, err)
	}
	if downloads.Waiting() != 1 {
		t.Fatal("the place was given back with most of the body still to come")
	}
	close(more)
	b, err := io.ReadAll(first.Body)
	if err != nil || n+len(b) != size {
		t.Fatalf("first body: %d bytes, %v", n+len(b), err)
	}
	firstDone.Store(true)
	if s := <-got; s != "second" {
		t.Fatalf("second request: %q, want it served while the first body was still arriving", s)
	}
}

// TestImageConfigTakesNoDownloadPlace: with every download place taken by
// older pulls' layers, a pull still gets its image config, which it needs
// before it can ask for any layer; its layers wait their turn.
func TestImageConfigTakesNoDownloadPlace(t *testing.T) {
	config := []byte(`{"rootfs":{"type":"layers"}}`)
	layer := []byte("layer bytes")
	manifest, err := json.Marshal(ocispec.Manifest{
		Config: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))},
		Layers: []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(layer), Size: int64(len(layer))}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := newBlobHost(t, nil)
	h.serve = func(w http.ResponseWriter, r *http.Request) bool {
		switch path.Base(r.URL.Path) {
		case "v1":
			w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
			w.Write(manifest)
		case digest.FromBytes(config).String():
			w.Write(config)
		default:
			w.Write(layer)
		}
		return true
	}
	downloads := lane.New(1)
	taken, err := downloads.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rec := &Recorder{}
	rec.OnFetched(func(digest.Digest) bool { return false }, func() {})
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{Downloads: downloads}, hostclient.Endpoint{Key: health.Key{Scheme: "http", Host: h.host(), Path: "/v2"}, Role: hostclient.RoleUpstream}, rec.observer())
	get := func(ref string) []byte {
		resp, err := c.Get(h.URL + "/v2/team/app/" + ref)
		if err != nil {
			t.Error(err)
			return nil
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Error(err)
		}
		return b
	}

	get("manifests/v1")
	configDone := make(chan []byte, 1)
	go func() { configDone <- get("blobs/" + digest.FromBytes(config).String()) }()
	select {
	case got := <-configDone:
		if !bytes.Equal(got, config) {
			t.Fatalf("config: %q", got)
		}
	case <-time.After(10 * time.Second):
		taken()
		t.Fatal("the image config waited for a download place")
	}
	layerDone := make(chan []byte, 1)
	go func() { layerDone <- get("blobs/" + digest.FromBytes(layer).String()) }()
	await.Until(t, 10*time.Second, "the layer to wait for a place", func() bool { return downloads.Waiting() == 1 })
	taken()
	if got := <-layerDone; !bytes.Equal(got, layer) {
		t.Fatalf("layer: %q", got)
	}
}

// costOf is the cost tests give a pull of bytes: 10 ms a MiB.
func costOf(bytes int64) time.Duration {
	return time.Duration(bytes * int64(time.Second) / (100 << 20))
}
