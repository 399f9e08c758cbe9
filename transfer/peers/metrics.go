package peers

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a fetch from one peer failed, as counted in Stats.FetchFailures
// and pullwise_peer_fetch_failures_total. Every peer tried and given up on
// counts once; ReasonNoPeer counts a Fetch that no peer served at all.
const (
	ReasonNoPeer  = "no_peer" // no provider served the blob: the caller goes to the registry
	ReasonDial    = "dial"    // the peer could not be reached in ReadTimeout
	ReasonRefused = "refused" // the peer answered that it does not hold the blob
	ReasonCorrupt = "corrupt" // the bytes did not match the digest or the size
	ReasonStalled = "stalled" // the peer sent nothing for ReadTimeout
	ReasonBroken  = "broken"  // the stream failed or broke the protocol
	ReasonDown    = "down"    // not tried: the node's health table has the peer marked down
)

var reasons = []string{ReasonNoPeer, ReasonDial, ReasonRefused, ReasonCorrupt, ReasonStalled, ReasonBroken, ReasonDown}

// Stats is a snapshot of a node's counters since it started.
type Stats struct {
	BytesServed   int64            // blob bytes sent to peers
	BytesFetched  int64            // verified blob bytes received from peers
	FetchFailures map[string]int64 // by Reason*
	Announced     int64            // announcements of a held blob that reached the DHT
	// ServedArriving counts blobs sent whole to a peer while, or after,
	// they arrived from a registry, before the store held them.
	ServedArriving int64
	Refused        int64 // requests answered "not found"
}

// counters are a node's counters; they are read as a Stats snapshot or
// collected by prometheus through Node.Collector.
type counters struct {
	served, fetched, announced atomic.Int64
	servedArriving, refused    atomic.Int64
	mu                         sync.Mutex
	failures                   map[string]int64
}

func (c *counters) failed(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failures == nil {
		c.failures = map[string]int64{}
	}
	c.failures[reason]++
}

func (c *counters) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := maps.Clone(c.failures)
	if f == nil {
		f = map[string]int64{}
	}
	return Stats{BytesServed: c.served.Load(), BytesFetched: c.fetched.Load(), FetchFailures: f, Announced: c.announced.Load(),
		ServedArriving: c.servedArriving.Load(), Refused: c.refused.Load()}
}

var (
	servedDesc = prometheus.NewDesc("pullwise_peer_bytes_served_total",
		"Blob bytes this node sent to its peers.", nil, nil)
	fetchedDesc = prometheus.NewDesc("pullwise_peer_bytes_fetched_total",
		"Verified blob bytes this node fetched from its peers.", nil, nil)
	failuresDesc = prometheus.NewDesc("pullwise_peer_fetch_failures_total",
		"Fetches from peers given up on, by reason.", []string{"reason"}, nil)
	announcedDesc = prometheus.NewDesc("pullwise_peer_announcements_total",
		"Announcements of a blob this node holds that reached the DHT.", nil, nil)
	servedArrivingDesc = prometheus.NewDesc("pullwise_peer_blobs_served_arriving_total",
		"Blobs this node sent whole to a peer as they arrived from a registry.", nil, nil)
	refusedDesc = prometheus.NewDesc("pullwise_peer_requests_refused_total",
		"Blob requests from peers this node answered it does not hold.", nil, nil)
	connectedDesc = prometheus.NewDesc("pullwise_peers_connected",
		"Peers this node is connected to in its DHT.", nil, nil)
)

// collector exports a node's counters to prometheus.
type collector struct {
	c     *counters
	peers func() int
}

func (m collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connectedDesc
	ch <- announcedDesc
	ch <- servedDesc
	ch <- fetchedDesc
	ch <- failuresDesc
	ch <- servedArrivingDesc
	ch <- refusedDesc
}

func (m collector) Collect(ch chan<- prometheus.Metric) {
	s := m.c.snapshot()
	ch <- prometheus.MustNewConstMetric(connectedDesc, prometheus.GaugeValue, float64(m.peers()))
	ch <- prometheus.MustNewConstMetric(announcedDesc, prometheus.CounterValue, float64(s.Announced))
	ch <- prometheus.MustNewConstMetric(servedDesc, prometheus.CounterValue, float64(s.BytesServed))
	ch <- prometheus.MustNewConstMetric(fetchedDesc, prometheus.CounterValue, float64(s.BytesFetched))
	ch <- prometheus.MustNewConstMetric(servedArrivingDesc, prometheus.CounterValue, float64(s.ServedArriving))
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(s.Refused))
	// Every reason is exported, zero or not, so rate() works from the
	// first failure on.
	for _, r := range reasons {
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(s.FetchFailures[r]), r)
	}
}
