package daemon

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Metric is the value of the prometheus sample whose name and labels
// match exactly, as the exposition writes them (`name` or
// `name{label="v"}`), and whether the daemon reports it at all.
func (d *Daemon) Metric(t testing.TB, sample string) (float64, bool) {
	t.Helper()
	// No keep-alive, so scraping leaves no connection (and goroutines)
	// behind in containerd.
	return Scrape(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, d.MetricsAddr, sample)
}

// Scrape reads sample from the prometheus endpoint at addr through c, for
// a daemon reached some other way than from this network namespace.
func Scrape(t testing.TB, c *http.Client, addr, sample string) (float64, bool) {
	t.Helper()
	resp, err := c.Get("http://" + addr + "/v1/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s %q: %v", sample, v, err)
			}
			return f, true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	return 0, false
}

// WriteTime is how long Pullwise's write turns have been held so far
// (transfer/commits): each write to the metadata database, with its wait
// for bolt's lock and, for a blob, the blob's own sync. It fails t when
// the daemon does not report it, rather than report a floor of 0.
func (d *Daemon) WriteTime(t testing.TB) time.Duration {
	t.Helper()
	const sample = `pullwise_metadata_write_seconds_sum{phase="write"}`
	v, ok := d.Metric(t, sample)
	if !ok {
		t.Fatalf("containerd reports no %s", sample)
	}
	return time.Duration(v * float64(time.Second))
}
