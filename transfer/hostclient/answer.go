package hostclient

import (
	"context"
	"crypto/tls"
	"errors"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pullwise/pullwise/transfer/health"
)

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

// retryAfter parses a Retry-After header: seconds or an HTTP date. The
// header is the registry's to write: a date in the past asks for no wait,
// and a number of seconds too large for a Duration asks for the longest
// one, not a negative one. Callers cap the wait anyway.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s > 0 {
		if s > int64(math.MaxInt64/time.Second) {
			return math.MaxInt64
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// parsePath splits a registry API path into the kind (manifests, blobs),
// the repository as the host knows it, and the reference. The API root
// "/v2" is dropped, but a mirror's own prefix (override_path) is kept:
// it is part of how that mirror names the repository.
func parsePath(p string) (kind, repo, ref string) {
	for _, k := range []string{"manifests", "blobs"} {
		i := strings.LastIndex(p, "/"+k+"/")
		if i < 0 {
			continue
		}
		ref = p[i+len(k)+2:]
		if ref == "" || strings.Contains(ref, "/") {
			return "", "", "" // e.g. /blobs/uploads/…
		}
		segs := strings.Split(strings.Trim(p[:i], "/"), "/")
		if j := slices.Index(segs, "v2"); j >= 0 {
			segs = slices.Delete(segs, j, j+1)
		}
		return k, strings.Join(segs, "/"), ref
	}
	return "", "", ""
}
