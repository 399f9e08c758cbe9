package registry

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/require"
)

// response is what a test client saw, including a body read error such as
// an unexpected EOF from a truncated response.
type response struct {
	status  int
	header  http.Header
	body    []byte
	readErr error
}

type client struct {
	t    *testing.T
	http *http.Client
}

// newClient uses a private transport so connections die with the test.
func newClient(t *testing.T) *client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{t: t, http: &http.Client{Transport: tr}}
}

func (c *client) do(ctx context.Context, method, url string, mutate func(*http.Request)) (response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	require.NoError(c.t, err)
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	if mutate != nil {
		mutate(req)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	body, readErr := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: body, readErr: readErr}, nil
}

// get issues a request that must get a response (whatever its status).
func (c *client) get(method, url string, mutate ...func(*http.Request)) response {
	c.t.Helper()
	var m func(*http.Request)
	if len(mutate) > 0 {
		m = mutate[0]
	}
	resp, err := c.do(c.t.Context(), method, url, m)
	require.NoError(c.t, err)
	return resp
}

func waitIdle(t *testing.T, r *Registry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.WaitIdle(ctx))
}

func manifestURL(r *Registry, repo, ref string) string {
	return r.URL() + "/v2/" + repo + "/manifests/" + ref
}

func blobURL(r *Registry, repo, dgst string) string {
	return r.URL() + "/v2/" + repo + "/blobs/" + dgst
}

// only returns the recorded requests matching kind and method.
func only(r *Registry, kind Kind, method string) []Request {
	var out []Request
	for _, req := range r.Requests() {
		if req.Kind == kind && req.Method == method {
			out = append(out, req)
		}
	}
	return out
}
