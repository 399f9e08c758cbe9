package lane

import "github.com/prometheus/client_golang/prometheus"

var costDesc = prometheus.NewDesc("pullwise_layer_write_seconds_per_mib",
	"What a MiB of compressed layer takes to write on this node now, learned per kind of compression (gzip, zstd, tar), from the layers written: the cost that places pulls in line.",
	[]string{"kind"}, nil)

// Describe implements prometheus.Collector.
func (c *Costs) Describe(ch chan<- *prometheus.Desc) { ch <- costDesc }

// Collect implements prometheus.Collector, reading the estimates at
// scrape time.
func (c *Costs) Collect(ch chan<- prometheus.Metric) {
	for kind, d := range c.PerMiB() {
		ch <- prometheus.MustNewConstMetric(costDesc, prometheus.GaugeValue, d.Seconds(), kind)
	}
}
