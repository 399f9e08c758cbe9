package lane

import (
	"strings"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Costs learns what a layer costs to write on this node, per kind of
// compression, from the layers the node writes (Applier), and gives a
// pull's cost from the layers it must fetch (Ticket.Need).
//
// A layer's cost is taken as its compressed bytes times the time per byte
// of its kind: inflating and writing dominate, and both grow with the
// bytes. The kinds differ several times over (gzip inflates at tens of
// MiB/s per CPU, zstd several times faster, an uncompressed tar only
// writes), so one rate for all would place a zstd image behind a gzip one
// of the same size.
type Costs struct {
	mu    sync.Mutex
	kinds map[string]*rate
}

// rate is a kind's time per byte: the time and bytes of the layers
// written, each older layer weighing less (forget), so that the estimate
// follows the node's load and disks.
type rate struct {
	nanos, bytes float64
}

// forget is how much of the past each new layer leaves: a layer's weight
// halves about every seven layers of its kind, enough to follow a node
// whose load changes within a burst, without one odd layer moving it far.
const forget = 0.9

// seed is where every kind's estimate starts, as if one layer of seedBytes
// had been written at the seed's speed. The speeds are what one CPU does
// on a typical cloud node; the first layers written replace them.
const seedBytes = 16 << 20

var seeds = map[string]float64{ // bytes per second
	"gzip": 40 << 20,
	"zstd": 150 << 20,
	"tar":  300 << 20, // uncompressed: written, not inflated
}

// kind is the compression of a layer media type: "gzip", "zstd" or "tar".
// Types it does not know (encrypted layers, vendors' own) cost as gzip,
// the common and the slowest of the three.
func kind(mediaType string) string {
	switch {
	case strings.HasSuffix(mediaType, "+zstd"), strings.HasSuffix(mediaType, ".zstd"):
		return "zstd"
	case strings.HasSuffix(mediaType, ".tar"): // OCI's and Docker's uncompressed layers
		return "tar"
	}
	return "gzip"
}

// NewCosts returns costs at their seeds.
func NewCosts() *Costs {
	c := &Costs{kinds: map[string]*rate{}}
	for k, speed := range seeds {
		c.kinds[k] = &rate{nanos: seedBytes / speed * 1e9, bytes: seedBytes}
	}
	return c
}

// Wrote records that a layer of mediaType and size (compressed bytes) took
// took to write. Layers too small to say anything about speed are left
// out: their time is the snapshot's set-up, not their bytes.
func (c *Costs) Wrote(mediaType string, size int64, took time.Duration) {
	if c == nil || size < minSample || took <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.kinds[kind(mediaType)]
	r.nanos = r.nanos*forget + float64(took)
	r.bytes = r.bytes*forget + float64(size)
}

// minSample is the smallest layer whose time is counted: below a MiB, a
// layer's time is mostly the snapshot's prepare and commit.
const minSample = 1 << 20

// Of is the cost of writing layers on this node, one after another.
func (c *Costs) Of(layers []ocispec.Descriptor) time.Duration {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var d float64
	for _, l := range layers {
		r := c.kinds[kind(l.MediaType)]
		d += float64(l.Size) * r.nanos / r.bytes
	}
	return time.Duration(d)
}

// PerMiB is the time a MiB of each kind takes to write now, for metrics
// and logs.
func (c *Costs) PerMiB() map[string]time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]time.Duration{}
	for k, r := range c.kinds {
		out[k] = time.Duration(r.nanos / r.bytes * (1 << 20))
	}
	return out
}
