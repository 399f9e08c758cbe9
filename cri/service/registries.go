package service

import (
	"context"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// Registry host states, as ListRegistries reports them.
const (
	stateUp      = "up"
	stateDown    = "down"
	stateProbing = "probing"
)

// Kinds of registry host, as ListRegistries reports them.
const (
	kindRegistry = "registry"
	kindStorage  = "storage"
	kindPeer     = "peer" // one of the node's peers (docs/peers.md)
)

// ListRegistries implements api.PullwiseServer.
func (s *Service) ListRegistries(context.Context, *api.ListRegistriesRequest) (*api.ListRegistriesResponse, error) {
	resp := &api.ListRegistriesResponse{}
	if s.rt.Registries == nil {
		return resp, nil
	}
	for _, h := range s.rt.Registries() {
		state := stateUp
		switch {
		case h.Probing:
			state = stateProbing
		case !h.Up:
			state = stateDown
		}
		r := &api.RegistryHost{
			Host:        h.Key.String(),
			State:       state,
			Since:       nanos(h.Since),
			LastError:   h.LastError,
			LastErrorAt: nanos(h.LastErrAt),
			NextProbe:   nanos(h.NextProbe),
			Failures:    int32(h.Failures),
			Requests:    make(map[string]uint64, len(h.Requests)),
			Kind:        kindRegistry,
			RetryAt:     nanos(h.RetryAt),
		}
		if h.Key.Scheme == "peer" {
			r.Kind = kindPeer
		}
		if len(h.Serves) > 0 {
			r.Kind = kindStorage
			for _, k := range h.Serves {
				r.Serves = append(r.Serves, k.String())
			}
		}
		for o, n := range h.Requests {
			r.Requests[string(o)] = n
		}
		resp.Hosts = append(resp.Hosts, r)
	}
	return resp, nil
}

// nanos is t in Unix nanoseconds, 0 for the zero time.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
