package registry

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func isBlob(r Request) bool     { return r.Kind == KindBlob }
func isManifest(r Request) bool { return r.Kind == KindManifest }

// seeded starts a registry holding one single-layer image and clears the
// push traffic from the recorder.
func seeded(t *testing.T, layer int64) (*Registry, Pushed) {
	reg := Start(t, Options{Name: "faulty"})
	p := reg.Push(t, "team/app", "v1", Image{Layers: []int64{layer}, Seed: 42})
	reg.Reset()
	return reg, p
}

func TestStatusFaults(t *testing.T) {
	reg, p := seeded(t, 1<<10)
	c := newClient(t)
	tests := []struct {
		name       string
		fault      *Fault
		method     string
		url        string
		wantCode   string // distribution error code in the body; "" for HEAD
		retryAfter string
	}{
		{"manifest 404", &Fault{Status: http.StatusNotFound}, http.MethodGet,
			manifestURL(reg, "team/app", "v1"), "MANIFEST_UNKNOWN", ""},
		{"blob 429 with Retry-After", &Fault{Status: http.StatusTooManyRequests, RetryAfter: 1500 * time.Millisecond},
			http.MethodGet, blobURL(reg, "team/app", p.Layers[0].String()), "TOOMANYREQUESTS", "2"},
		{"blob 503", &Fault{Status: http.StatusServiceUnavailable}, http.MethodGet,
			blobURL(reg, "team/app", p.Layers[0].String()), "UNAVAILABLE", ""},
		{"manifest HEAD 500", &Fault{Status: http.StatusInternalServerError}, http.MethodHead,
			manifestURL(reg, "team/app", "v1"), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg.Reset()
			reg.SetFault(func(Request) *Fault { return tt.fault })
			resp := c.get(tt.method, tt.url)
			assert.Equal(t, tt.fault.Status, resp.status)
			assert.Equal(t, tt.retryAfter, resp.header.Get("Retry-After"))
			if tt.wantCode != "" {
				var body struct{ Errors []struct{ Code string } }
				require.NoError(t, json.Unmarshal(resp.body, &body))
				require.Len(t, body.Errors, 1)
				assert.Equal(t, tt.wantCode, body.Errors[0].Code)
			}

			reg.SetFault(nil)
			assert.Equal(t, http.StatusOK, c.get(tt.method, tt.url).status, "served normally once the fault is removed")
			waitIdle(t, reg)
			got := reg.Requests()
			require.Len(t, got, 2)
			assert.Equal(t, tt.fault.Status, got[0].Status)
			assert.True(t, got[0].Faulted)
			assert.False(t, got[1].Faulted)
		})
	}
}

func TestTimesFaultsOnlyFirstMatches(t *testing.T) {
	reg, p := seeded(t, 1<<10)
	reg.SetFault(Times(2, When(isBlob, &Fault{Status: http.StatusServiceUnavailable})))
	c := newClient(t)

	// Manifests don't match, so they neither fail nor use up the budget.
	assert.Equal(t, http.StatusOK, c.get(http.MethodGet, manifestURL(reg, "team/app", "v1")).status)
	var statuses []int
	for range 3 {
		statuses = append(statuses, c.get(http.MethodGet, blobURL(reg, "team/app", p.Layers[0].String())).status)
	}
	assert.Equal(t, []int{503, 503, 200}, statuses)
}

func TestTruncateAbortsBody(t *testing.T) {
	reg, p := seeded(t, 64<<10)
	const limit = 10000
	reg.SetFault(When(isBlob, &Fault{TruncateAfter: limit}))

	resp := newClient(t).get(http.MethodGet, blobURL(reg, "team/app", p.Layers[0].String()))
	assert.Equal(t, http.StatusOK, resp.status)
	assert.ErrorIs(t, resp.readErr, io.ErrUnexpectedEOF)
	assert.Len(t, resp.body, limit)

	waitIdle(t, reg)
	got := only(reg, KindBlob, http.MethodGet)
	require.Len(t, got, 1)
	assert.EqualValues(t, limit, got[0].Bytes)
	assert.True(t, got[0].Faulted)
}

func TestThrottlePacesBody(t *testing.T) {
	reg, p := seeded(t, 48<<10)
	const bps = 192 << 10
	reg.SetFault(When(isBlob, &Fault{BytesPerSecond: bps}))

	start := time.Now()
	resp := newClient(t).get(http.MethodGet, blobURL(reg, "team/app", p.Layers[0].String()))
	elapsed := time.Since(start)
	require.Equal(t, http.StatusOK, resp.status)
	require.NoError(t, resp.readErr)
	assert.Equal(t, p.Layers[0], digest.FromBytes(resp.body), "throttling must not alter content")

	// No byte may arrive before its time, so the whole body takes at least
	// size/bps.
	minimum := time.Duration(float64(p.LayerSizes[0]) / bps * float64(time.Second))
	assert.GreaterOrEqual(t, elapsed, minimum)

	waitIdle(t, reg)
	got := only(reg, KindBlob, http.MethodGet)
	require.Len(t, got, 1)
	assert.Equal(t, p.LayerSizes[0], got[0].Bytes)
	assert.GreaterOrEqual(t, got[0].Duration(), minimum)
	assert.True(t, got[0].Faulted)
}

func TestDelay(t *testing.T) {
	reg, _ := seeded(t, 1<<10)
	c := newClient(t)
	url := manifestURL(reg, "team/app", "v1")

	t.Run("waits before serving", func(t *testing.T) {
		const delay = 100 * time.Millisecond
		reg.SetFault(When(isManifest, &Fault{Delay: delay}))
		start := time.Now()
		assert.Equal(t, http.StatusOK, c.get(http.MethodHead, url).status)
		assert.GreaterOrEqual(t, time.Since(start), delay)
	})

	t.Run("ends when the client goes away", func(t *testing.T) {
		reg.Reset()
		entered := make(chan struct{}, 1)
		reg.SetFault(func(Request) *Fault {
			entered <- struct{}{}
			return &Fault{Delay: time.Hour}
		})
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			<-entered
			cancel()
		}()
		_, err := c.do(ctx, http.MethodHead, url, nil)
		assert.ErrorIs(t, err, context.Canceled)

		waitIdle(t, reg) // returns only once the handler stopped waiting
		got := reg.Requests()
		require.Len(t, got, 1)
		assert.Zero(t, got[0].Status, "nothing was written")
		assert.True(t, got[0].Faulted)
	})
}

func TestRequireBasicAuth(t *testing.T) {
	reg, p := seeded(t, 1<<10)
	reg.SetFault(func(Request) *Fault {
		return &Fault{RequireBasicAuth: &BasicAuth{User: "alice", Password: "s3cret"}}
	})
	c := newClient(t)
	url := manifestURL(reg, "team/app", "v1")
	withAuth := func(user, pass string) func(*http.Request) {
		return func(r *http.Request) { r.SetBasicAuth(user, pass) }
	}

	resp := c.get(http.MethodGet, url)
	assert.Equal(t, http.StatusUnauthorized, resp.status)
	assert.Equal(t, `Basic realm="faulty"`, resp.header.Get("WWW-Authenticate"))
	assert.Equal(t, http.StatusUnauthorized, c.get(http.MethodGet, url, withAuth("alice", "wrong")).status)

	resp = c.get(http.MethodGet, url, withAuth("alice", "s3cret"))
	require.Equal(t, http.StatusOK, resp.status)
	assert.Equal(t, p.Digest, digest.FromBytes(resp.body))

	waitIdle(t, reg)
	var faulted []bool
	for _, r := range reg.Requests() {
		faulted = append(faulted, r.Faulted)
	}
	assert.Equal(t, []bool{true, true, false}, faulted, "matching credentials pass through untouched")
}
