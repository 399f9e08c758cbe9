package hostclient

import (
	"bytes"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/integration/registry"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/lane"
)

// BenchmarkDownloadsOverWAN: 24 blobs of 1 MiB, all wanted at once, through
// three download places (max_concurrent_downloads' default) over
// registry.DefaultWAN: 20 ms per request, 64 MiB/s shared. "held" keeps a
// place from the request to the body's end, as containerd's limiter does;
// "overlap" is Pullwise's place, given back in the body's last round trip.
// link-use is the share of the link's 64 MiB/s the downloads got.
func BenchmarkDownloadsOverWAN(b *testing.B) {
	const blobs, places = 24, 3
	blob := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(blob)
	srv := httptest.NewServer(registry.DefaultWAN.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(blob))
	})))
	b.Cleanup(srv.Close)
	url := srv.URL + "/v2/team/app/blobs/" + digest.FromBytes(blob).String()
	ep := Endpoint{Key: health.Key{Scheme: "http", Host: strings.TrimPrefix(srv.URL, "http://"), Path: "/v2"}, Role: RoleUpstream}

	get := func(b *testing.B, c *http.Client) {
		resp, err := c.Get(url)
		if err != nil {
			b.Error(err)
			return
		}
		defer resp.Body.Close()
		if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != int64(len(blob)) {
			b.Errorf("read %d bytes: %v", n, err)
		}
	}
	for _, mode := range []string{"held", "overlap"} {
		b.Run(mode, func(b *testing.B) {
			downloads := lane.New(places)
			transport := &http.Transport{MaxIdleConnsPerHost: blobs}
			b.Cleanup(transport.CloseIdleConnections)
			plain := &http.Client{Transport: transport}
			overlapped := Wrap(plain, Node{Downloads: downloads}, ep, nopObserver{})
			var took time.Duration
			for b.Loop() {
				start := time.Now()
				var wg sync.WaitGroup
				for range blobs {
					wg.Go(func() {
						if mode == "overlap" {
							get(b, overlapped)
							return
						}
						release, err := downloads.Acquire(b.Context())
						if err != nil {
							b.Error(err)
							return
						}
						defer release()
						get(b, plain)
					})
				}
				wg.Wait()
				took += time.Since(start)
			}
			mibps := float64(blobs*b.N) / took.Seconds()
			b.ReportMetric(mibps, "MiB/s")
			b.ReportMetric(mibps/float64(registry.DefaultWAN.BytesPerSecond>>20), "link-use")
		})
	}
}

// nopObserver hears nothing: what the hosts answered is transfer/source's
// to record.
type nopObserver struct{}

func (nopObserver) IsConfig(digest.Digest) bool                  { return false }
func (nopObserver) Attempted(Attempt)                            {}
func (nopObserver) AskedToWait(time.Duration)                    {}
func (nopObserver) Manifest(_, _, _ string, _ bool) func([]byte) { return nil }
func (nopObserver) Blob(_, _ string) func(int64)                 { return nil }
