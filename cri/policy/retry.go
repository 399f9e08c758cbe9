package policy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	remoteserrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Retry bounds how long a digest check keeps trying a registry that is
// unreachable, overloaded (429) or failing (5xx) before the local image is
// used. Every wait also stays inside the caller's deadline.
type Retry struct {
	Attempts int           // checks in all, at least 1
	Backoff  time.Duration // first wait; doubles
	MaxWait  time.Duration // longest single wait, Retry-After included
}

// DefaultRetry keeps a pod start waiting a few seconds at most. containerd's
// resolver already repeats a request a few times itself (429 up to five
// times, 5xx once), so one more check after a pause is enough.
var DefaultRetry = Retry{Attempts: 2, Backoff: 500 * time.Millisecond, MaxWait: 2 * time.Second}

func (d *Decider) resolve(ctx context.Context, ref string, auth *runtime.AuthConfig) (digest.Digest, string, error) {
	wait := d.retry.Backoff
	var lastErr error
	for attempt := 1; ; attempt++ {
		dg, source, retryAfter, err := d.deps.Resolve(ctx, ref, auth)
		if err == nil {
			return dg, source, nil
		}
		lastErr = err
		if !unavailable(err) || attempt >= d.retry.Attempts {
			return "", "", lastErr
		}
		next := min(max(wait, retryAfter), d.retry.MaxWait)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < next {
			return "", "", fmt.Errorf("no time left to retry before the deadline: %w", lastErr)
		}
		log.G(ctx).WithError(err).WithField("image", ref).WithField("wait", next).Debug("digest check failed; retrying")
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", "", errors.Join(ctx.Err(), lastErr)
		case <-t.C:
		}
		wait *= 2
	}
}

// unavailable reports errors that mean the registry could not answer:
// network errors, 429 and 5xx. Credentials failures (401, 403) and a
// missing image (404) are answers, and never hide behind a local copy.
func unavailable(err error) bool {
	// Every host failed (source.AllFailedError), with the code of the
	// answers.
	if errdefs.IsUnavailable(err) || errdefs.IsResourceExhausted(err) {
		return true
	}
	if errdefs.IsUnauthorized(err) || errdefs.IsPermissionDenied(err) {
		return false
	}
	var status remoteserrors.ErrUnexpectedStatus
	if errors.As(err, &status) {
		return status.StatusCode == 429 || status.StatusCode >= 500
	}
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) || errors.Is(err, context.DeadlineExceeded)
}
