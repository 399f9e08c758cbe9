package source

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/pullwise/pullwise/transfer/health"
)

// attempt is one request of a pull to one host and what came of it.
type attempt struct {
	kind, ref string // manifests or blobs, and the tag or digest
	ep        endpoint
	outcome   health.Outcome
	status    int    // HTTP status; 0 when there was no response
	detail    string // status line or error, never a URL
}

// attempt notes how a manifest or blob request to ep went.
func (r *Recorder) attempt(kind, ref string, ep endpoint, o health.Outcome, status int, detail string) {
	if kind == "" || o == health.Canceled {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = append(r.attempts, attempt{kind: kind, ref: ref, ep: ep, outcome: o, status: status, detail: detail})
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
		k := res{a.kind, a.ref}
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
		if a.outcome == health.OK {
			served[k] = true
		}
		if len(a.ep.later) == 0 {
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
			if a.kind != k.kind || a.ref != k.ref {
				continue
			}
			h := HostAnswer{Role: a.ep.role, Host: hostName(a.ep.key), Answer: a.detail, status: a.status}
			// One line per host: its last answer, in the order first asked.
			if i, ok := seen[a.ep.key]; ok {
				e.Hosts[i] = h
				continue
			}
			seen[a.ep.key] = len(e.Hosts)
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
