package source

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/hostclient"
)

// attempt notes how a manifest or blob request went.
func (r *Recorder) attempt(a hostclient.Attempt) {
	if a.Kind == "" || a.Outcome == health.Canceled {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = append(r.attempts, a)
}

// HostAnswer is what one host answered for the request that failed.
type HostAnswer struct {
	Role   string // mirror or upstream
	Host   string // host[:port], with the path prefix of an override_path mirror
	Answer string
	status int // 0 when the host did not answer or was skipped
}

// AllFailedError is a pull that no registry host could serve: it names every
// host tried, in order, with its answer. It unwraps to the errdefs error
// that fits the answers, which the API edge turns into a gRPC code.
type AllFailedError struct {
	Ref   string
	Hosts []HostAnswer
}

func (e *AllFailedError) Error() string {
	parts := make([]string, len(e.Hosts))
	for i, h := range e.Hosts {
		parts[i] = fmt.Sprintf("%s %s: %s", h.Role, h.Host, h.Answer)
	}
	return fmt.Sprintf("all registries failed for %s: %s", e.Ref, strings.Join(parts, "; "))
}

// Unwrap picks the code from the hosts' answers. Credentials problems say
// what to fix, so they come first; a 404 counts only if every host said so
// (a skipped mirror may hold the image); throttling tells the caller to
// come back later; anything else means the registries could not be
// reached.
func (e *AllFailedError) Unwrap() error {
	has := func(status int) bool {
		return slices.ContainsFunc(e.Hosts, func(h HostAnswer) bool { return h.status == status })
	}
	all404 := !slices.ContainsFunc(e.Hosts, func(h HostAnswer) bool { return h.status != http.StatusNotFound })
	switch {
	case has(http.StatusUnauthorized):
		return errdefs.ErrUnauthenticated
	case has(http.StatusForbidden):
		return errdefs.ErrPermissionDenied
	case all404:
		return errdefs.ErrNotFound
	case has(http.StatusTooManyRequests):
		return errdefs.ErrResourceExhausted
	}
	return errdefs.ErrUnavailable
}

// Failure explains a failed pull of ref by the first manifest or blob that
// every host failed to serve: containerd went through its whole host list
// for it (the last host always answers or fails; it is never skipped) and
// none served it. It returns nil when no request failed that way, such as
// a pull that failed after fetching, or was cancelled.
func (r *Recorder) Failure(ref string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	type res struct{ kind, ref string }
	served := map[res]bool{}
	lastTried := map[res]bool{}
	var order []res
	for _, a := range r.attempts {
		if a.Endpoint.Role == hostclient.RolePeer {
			// A peer that lacks a blob is not the registries failing.
			continue
		}
		k := res{a.Kind, a.Ref}
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
		if a.Outcome == health.OK {
			served[k] = true
		}
		if len(a.Endpoint.Later) == 0 {
			lastTried[k] = true
		}
	}
	for _, k := range order {
		if served[k] || !lastTried[k] {
			continue
		}
		e := &AllFailedError{Ref: ref}
		seen := map[health.Key]int{}
		for _, a := range r.attempts {
			if a.Kind != k.kind || a.Ref != k.ref || a.Endpoint.Role == hostclient.RolePeer {
				continue
			}
			ep := a.Endpoint
			h := HostAnswer{Role: ep.Role, Host: hostName(ep.Key), Answer: a.Detail, status: a.Status}
			// One line per host: its last answer, in the order first asked.
			if i, ok := seen[ep.Key]; ok {
				e.Hosts[i] = h
				continue
			}
			seen[ep.Key] = len(e.Hosts)
			e.Hosts = append(e.Hosts, h)
		}
		return e
	}
	return nil
}

// hostName is a host as an operator wrote it in hosts.toml: with the path
// prefix only when it is not the API root.
func hostName(k health.Key) string {
	if k.Path == "" || k.Path == "/v2" {
		return k.Host
	}
	return k.Host + strings.TrimSuffix(k.Path, "/v2")
}
