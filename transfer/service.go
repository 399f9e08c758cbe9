// Package transfer wraps containerd's local transfer service. Every image
// pull on the node reaches it, whether it came from CRI, `ctr image pull` or
// the Pullwise API, which makes it the one place for node-wide pull
// behaviour: the pull gate, the progress tap and the source recorder.
package transfer

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/prometheus/client_golang/prometheus"
)

// Pull outcomes, as counted in pullwise_pulls_total.
const (
	OutcomePulled = "pulled"
	OutcomeFailed = "failed"
)

// Service is a transfer.Transferrer that passes every transfer to the
// wrapped service and gives image pulls their own path.
type Service struct {
	next  transfer.Transferrer
	pulls *prometheus.CounterVec
}

// New wraps next. Metrics are registered on reg.
func New(next transfer.Transferrer, reg prometheus.Registerer) (*Service, error) {
	pulls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "pullwise",
		Name:      "pulls_total",
		Help:      "Image pulls that went through the transfer service, by outcome.",
	}, []string{"outcome"})
	if err := reg.Register(pulls); err != nil {
		return nil, fmt.Errorf("register pull metrics: %w", err)
	}
	for _, o := range []string{OutcomePulled, OutcomeFailed} {
		pulls.WithLabelValues(o)
	}
	return &Service{next: next, pulls: pulls}, nil
}

// Transfer implements transfer.Transferrer.
func (s *Service) Transfer(ctx context.Context, src, dst any, opts ...transfer.Opt) error {
	if isPull(src, dst) {
		return s.pull(ctx, src, dst, opts)
	}
	return s.next.Transfer(ctx, src, dst, opts...)
}

// isPull matches what the local transfer service treats as a pull: a
// registry source into the image store.
func isPull(src, dst any) bool {
	_, fetch := src.(transfer.ImageFetcher)
	_, store := dst.(transfer.ImageStorer)
	return fetch && store
}

// pull is where node-wide pull behaviour plugs in, outermost first:
//   - the pull gate (node-wide limit, dedupe, fast path) around the call;
//   - the source recorder, replacing src with a fetcher whose transport
//     notes which host served each request;
//   - the progress tap, wrapping the caller's progress func (kept, since
//     CRI's stall timeout depends on the events).
func (s *Service) pull(ctx context.Context, src, dst any, opts []transfer.Opt) error {
	err := s.next.Transfer(ctx, src, dst, opts...)
	if err != nil {
		s.pulls.WithLabelValues(OutcomeFailed).Inc()
		return err
	}
	s.pulls.WithLabelValues(OutcomePulled).Inc()
	return nil
}
