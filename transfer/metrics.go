package transfer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Pull outcomes, as counted in pullwise_pulls_total.
const (
	OutcomePulled   = "pulled"    // fetched from a registry
	OutcomeFastPath = "fast_path" // already present and unpacked
	OutcomeDeduped  = "deduped"   // shared an identical pull in flight
	OutcomeFailed   = "failed"
	OutcomeTimedOut = "timed_out" // waited longer than pull_queue_timeout
	OutcomeDiskFull = "disk_full" // no room on the disk for it (transfer/space)
)

type metrics struct {
	pulls      *prometheus.CounterVec
	waitTime   prometheus.Histogram
	lazyLayers prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, running, waiting func() float64) (*metrics, error) {
	m := &metrics{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pullwise",
			Name:      "pulls_total",
			Help:      "Image pulls that went through the transfer service, by outcome.",
		}, []string{"outcome"}),
		waitTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "pullwise",
			Name:      "pull_wait_seconds",
			Help:      "Time pulls waited for a slot under max_parallel_image_pulls.",
			Buckets:   []float64{0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}),
		lazyLayers: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pullwise",
			Name:      "lazy_layers_total",
			Help:      "Layers a remote snapshotter (stargz, SOCI, nydus) mounted lazily: containerd fetched none of their bytes.",
		}),
	}
	collectors := []prometheus.Collector{
		m.pulls, m.waitTime, m.lazyLayers,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "pullwise",
			Name:      "pulls_in_flight",
			Help:      "Image pulls holding a slot (transferring from a registry).",
		}, running),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "pullwise",
			Name:      "pulls_waiting",
			Help:      "Image pulls queued for a slot.",
		}, waiting),
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register pull metrics: %w", err)
		}
	}
	for _, o := range []string{OutcomePulled, OutcomeFastPath, OutcomeDeduped, OutcomeFailed, OutcomeTimedOut, OutcomeDiskFull} {
		m.pulls.WithLabelValues(o)
	}
	return m, nil
}
