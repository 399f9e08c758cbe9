package hostclient

import (
	"context"
	"net/http"
	"sync"

	"github.com/containerd/containerd/v2/core/remotes/docker"
)

// Renewing returns inner as a registry host's authorizer, shared by one
// pull's requests, that starts afresh with renew's after a failed token
// fetch; renew may return nil, and inner is kept.
func Renewing(inner docker.Authorizer, renew func() docker.Authorizer) docker.Authorizer {
	return &renewingAuthorizer{inner: inner, renew: renew}
}

// renewingAuthorizer is a registry host's authorizer, shared by one pull's
// requests (see source.NewResolver), that starts afresh after a failed token
// fetch. containerd's authorizer keeps a token fetch's error for its scope
// without expiry and answers every later request with it: shared, one
// token server hiccup in a waiting pull's prefetch would fail the whole
// pull, where an authorizer of its own would have asked again.
type renewingAuthorizer struct {
	renew func() docker.Authorizer // a fresh one, or nil

	mu    sync.Mutex
	inner docker.Authorizer
}

func (a *renewingAuthorizer) current() docker.Authorizer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inner
}

func (a *renewingAuthorizer) Authorize(ctx context.Context, req *http.Request) error {
	inner := a.current()
	err := inner.Authorize(ctx, req)
	if err != nil {
		if fresh := a.renew(); fresh != nil {
			a.mu.Lock()
			// Requests failing together renew it once.
			if a.inner == inner {
				a.inner = fresh
			}
			a.mu.Unlock()
		}
	}
	return err
}

func (a *renewingAuthorizer) AddResponses(ctx context.Context, responses []*http.Response) error {
	return a.current().AddResponses(ctx, responses)
}
