package hostclient

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/health"
)

// arrivals records what the host client shares of each blob body.
type arrivals struct {
	mu   sync.Mutex
	got  []arrival
	open int
}

type arrival struct {
	dgst         digest.Digest
	offset, size int64
	bytes.Buffer
	closed bool
}

func (a *arrivals) Arriving(d digest.Digest, offset, size int64) io.WriteCloser {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, arrival{dgst: d, offset: offset, size: size})
	a.open++
	return &arrivalWriter{a: a, i: len(a.got) - 1}
}

type arrivalWriter struct {
	a *arrivals
	i int
}

func (w *arrivalWriter) Write(p []byte) (int, error) {
	w.a.mu.Lock()
	defer w.a.mu.Unlock()
	return w.a.got[w.i].Write(p)
}

func (w *arrivalWriter) Close() error {
	w.a.mu.Lock()
	defer w.a.mu.Unlock()
	w.a.got[w.i].closed = true
	w.a.open--
	return nil
}

// TestBlobBodiesAreShared: every blob body read from a host goes, byte for
// byte and from where it starts in the blob, to the node's arrivals, which
// learn its end when the body closes; manifests and failed answers are not
// shared.
func TestBlobBodiesAreShared(t *testing.T) {
	blob := bytes.Repeat([]byte("0123456789"), 10000)
	d := digest.FromBytes(blob)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()):
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(blob))
		case strings.Contains(r.URL.Path, "/manifests/"):
			io.WriteString(w, "{}")
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	shared := &arrivals{}
	ep := Endpoint{Key: health.Key{Scheme: "http", Host: strings.TrimPrefix(srv.URL, "http://"), Path: "/v2"}, Role: RoleUpstream}
	c := Wrap(&http.Client{}, Node{Arrivals: shared}, ep, nopObserver{})
	for _, tc := range []struct {
		name  string
		path  string
		rng   string
		want  []byte
		share bool
		from  int64
	}{
		{name: "whole blob", path: "/blobs/" + d.String(), want: blob, share: true},
		{name: "resumed blob", path: "/blobs/" + d.String(), rng: "bytes=12345-", want: blob[12345:], share: true, from: 12345},
		{name: "manifest", path: "/manifests/v1", want: []byte("{}")},
		{name: "missing blob", path: "/blobs/" + digest.FromString("x").String(), want: []byte("404 page not found\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shared.got = nil
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v2/team/app"+tc.path, nil)
			if tc.rng != "" {
				req.Header.Set("Range", tc.rng)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("body: %d bytes, %v", len(got), err)
			}
			shared.mu.Lock()
			defer shared.mu.Unlock()
			if !tc.share {
				if len(shared.got) != 0 {
					t.Fatalf("shared %d bodies, want none", len(shared.got))
				}
				return
			}
			if len(shared.got) != 1 {
				t.Fatalf("shared %d bodies, want 1", len(shared.got))
			}
			a := &shared.got[0]
			if a.dgst != d || a.offset != tc.from || a.size != int64(len(blob)) || !bytes.Equal(a.Bytes(), tc.want) || !a.closed {
				t.Fatalf("shared %s from %d of %d, %d bytes, closed %v; want %s from %d of %d, %d bytes, closed",
					a.dgst, a.offset, a.size, a.Len(), a.closed, d, tc.from, len(blob), len(tc.want))
			}
		})
	}
	if shared.open != 0 {
		t.Fatalf("%d arrivals left open", shared.open)
	}
}
