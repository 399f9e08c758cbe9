package health

import "github.com/prometheus/client_golang/prometheus"

var (
	upDesc = prometheus.NewDesc("pullwise_registry_host_up",
		"1 while a registry host is used, 0 while it is skipped after failing.",
		[]string{"host"}, nil)
	requestsDesc = prometheus.NewDesc("pullwise_registry_requests_total",
		"Requests to registry hosts by outcome, skipped ones included.",
		[]string{"host", "outcome"}, nil)
)

// Describe implements prometheus.Collector.
func (t *Table) Describe(ch chan<- *prometheus.Desc) {
	ch <- upDesc
	ch <- requestsDesc
}

// Collect implements prometheus.Collector. The table is read at scrape
// time, so requests pay for no metric updates of their own.
func (t *Table) Collect(ch chan<- prometheus.Metric) {
	for _, s := range t.Hosts() {
		host := s.Key.String()
		up := 0.0
		if s.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, host)
		for _, o := range Outcomes {
			if n, ok := s.Requests[o]; ok {
				ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(n), host, string(o))
			}
		}
	}
}
