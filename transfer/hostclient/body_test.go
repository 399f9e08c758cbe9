package hostclient

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/lane"
)

// TestPausedBodyTricklesWaitingForAPlace: a body that gave its download
// place to a pull ahead, and waits for a place again while that pull's
// body holds it, reads a little every trickleEvery all the while, so that
// no sender or proxy takes its connection for dead; it reads to its end
// once it has a place.
func TestPausedBodyTricklesWaitingForAPlace(t *testing.T) {
	defer func(d time.Duration) { trickleEvery = d }(trickleEvery)
	trickleEvery = 50 * time.Millisecond

	blob := bytes.Repeat([]byte("layer bytes "), 1<<18)
	// At 16 MiB/s, so that the large body is still arriving when it is
	// next asked whether to give way (every 20 ms).
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(blob)))
		for rest := blob; len(rest) > 0; rest = rest[min(len(rest), 32<<10):] {
			if _, err := w.Write(rest[:min(len(rest), 32<<10)]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Millisecond)
		}
	}))
	defer srv.Close()
	downloads := lane.New(1)
	ep := Endpoint{Key: health.Key{Scheme: "http", Host: strings.TrimPrefix(srv.URL, "http://"), Path: "/v2"}, Role: RoleUpstream}
	c := Wrap(&http.Client{}, Node{Downloads: downloads, Link: lane.NewLink(time.Second)}, ep, nopObserver{})
	url := srv.URL + "/v2/team/app/blobs/" + digest.FromBytes(blob).String()
	get := func(cost time.Duration) (*http.Response, error) {
		tk := lane.NewTicket(time.Now())
		tk.Need(cost)
		req, err := http.NewRequestWithContext(lane.WithTicket(context.Background(), tk), http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		return c.Do(req)
	}

	large, err := get(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer large.Body.Close()
	var read atomic.Int64
	buf := make([]byte, 32<<10)
	n, err := large.Body.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	read.Add(int64(n))
	smallAnswered := make(chan *http.Response, 1)
	go func() {
		resp, err := get(time.Millisecond)
		if err != nil {
			t.Error(err)
			close(smallAnswered)
			return
		}
		smallAnswered <- resp
	}()
	await.Until(t, 10*time.Second, "the small pull to wait for the place", func() bool { return downloads.Waiting() == 1 })

	largeDone := make(chan error, 1)
	go func() {
		for {
			n, err := large.Body.Read(buf)
			read.Add(int64(n))
			if err != nil {
				largeDone <- err
				return
			}
		}
	}()
	small := <-smallAnswered
	if small == nil {
		t.FailNow()
	}
	// The small body holds the only place, unread: the large one waits
	// for it, and trickles.
	await.Until(t, 10*time.Second, "the large body to wait for a place", func() bool { return downloads.Waiting() == 1 })
	from := read.Load()
	await.Until(t, 10*time.Second, "the waiting body to read a trickle twice", func() bool { return read.Load() >= from+2*trickle })
	if got := read.Load(); got >= int64(len(blob)) || downloads.Waiting() != 1 {
		t.Fatalf("the large body read %d bytes of %d with %d waiting: it did not wait for the place", got, len(blob), downloads.Waiting())
	}

	if _, err := io.Copy(io.Discard, small.Body); err != nil {
		t.Fatal(err)
	}
	small.Body.Close()
	if err := <-largeDone; err != io.EOF {
		t.Fatalf("large body: %v", err)
	}
	if got := read.Load(); got != int64(len(blob)) {
		t.Fatalf("large body: %d bytes, want %d", got, len(blob))
	}
}

// TestBlobBodyDebugLine: at debug level, a blob body on the link says once,
// when closed, which blob it was and what it read, though the close comes
// while a Read waits for bytes that never come (as a stalled body's abort
// does); at info level it says nothing.
func TestBlobBodyDebugLine(t *testing.T) {
	blob := bytes.Repeat([]byte("x"), 64<<10)
	d := digest.FromBytes(blob)
	never := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(blob)+1))
		w.Write(blob)
		w.(http.Flusher).Flush()
		<-never // the last byte
	}))
	defer srv.Close()
	defer close(never)
	ep := Endpoint{Key: health.Key{Scheme: "http", Host: strings.TrimPrefix(srv.URL, "http://"), Path: "/v2"}, Role: RoleUpstream}

	for _, tc := range []struct {
		level logrus.Level
		lines int
	}{{logrus.DebugLevel, 1}, {logrus.InfoLevel, 0}} {
		t.Run(tc.level.String(), func(t *testing.T) {
			var out bytes.Buffer
			logger := logrus.New()
			logger.SetOutput(&out)
			logger.SetLevel(tc.level)
			ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
			c := Wrap(&http.Client{}, Node{Downloads: lane.New(1), Link: lane.NewLink(lane.Slack)}, ep, nopObserver{})
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v2/team/app/blobs/"+d.String(), nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(resp.Body, make([]byte, len(blob))); err != nil {
				t.Fatal(err)
			}
			read := make(chan error, 1)
			go func() {
				_, err := resp.Body.Read(make([]byte, 1))
				read <- err
			}()
			resp.Body.Close()
			if err := <-read; err == nil {
				t.Fatal("a Read of a closed body waiting for bytes did not fail")
			}
			resp.Body.Close()

			lines := strings.Count(out.String(), `msg="blob body read"`)
			if lines != tc.lines || (lines > 0 && (!strings.Contains(out.String(), "blob=\""+d.String()+"\"") || !strings.Contains(out.String(), "bytes=65536"))) {
				t.Fatalf("%d debug lines, want %d naming the blob and its 65536 bytes:\n%s", lines, tc.lines, out.String())
			}
		})
	}
}
