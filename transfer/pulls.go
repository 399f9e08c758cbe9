package transfer

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"

	"github.com/containerd/containerd/v2/core/transfer"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/transfer/hostclient"
	"github.com/pullwise/pullwise/transfer/lane"
	"github.com/pullwise/pullwise/transfer/source"
)

// Pull states, as ListPulls reports them.
const (
	StateWaiting   = "waiting"           // queued for a slot
	StateNoSpace   = "waiting-for-space" // queued until the disk has room for it (transfer/space)
	StatePulling   = "pulling"           // holding a slot, fetching
	StateUnpacking = "unpacking"         // every blob fetched; slot given back, or kept (gate.Handback)
)

// PullStatus is one pull in flight or waiting, shared callers counted once.
type PullStatus struct {
	Image      string
	Pod        *runtime.PodSandboxMetadata // nil when no pod asked
	State      string
	Waited     time.Duration // time spent queued for a slot so far
	BytesDone  int64
	BytesTotal int64
	Callers    int // callers sharing the pull
	// BytesFromPeers are the blob bytes read from the node's peers.
	BytesFromPeers int64
}

// tracker knows the pulls in flight, for ListPulls.
type tracker struct {
	mu    sync.Mutex
	pulls map[*pull]struct{}
}

type pull struct {
	key      string // dedupe key, to count the callers sharing it
	image    string
	pod      *runtime.PodSandboxMetadata
	queued   time.Time
	started  time.Time                    // zero while waiting
	fetched  time.Time                    // zero until every blob is in
	left     int64                        // bytes to fetch, learned while waiting; 0: not known
	progress map[string]transfer.Progress // latest per descriptor

	// First and last blob bytes read, in Unix nanoseconds, for the
	// timeline; written by fetching goroutines.
	firstByte, lastByte atomic.Int64
	// lazyLayers counts layers a remote snapshotter mounted lazily.
	lazyLayers atomic.Int64
	// noSpace is set while the pull waits for disk space.
	noSpace atomic.Bool
	// rec records where the pull's blobs come from, once it does.
	rec atomic.Pointer[source.Fetcher]
}

// fromPeers adds up the blob bytes res says peers served.
func fromPeers(res source.Result) int64 {
	var n int64
	for host, s := range res.Blobs {
		if strings.HasPrefix(host, hostclient.PeerPrefix) {
			n += s.Bytes
		}
	}
	return n
}

// waitForSpace marks p as waiting for disk space, or no longer.
func (t *tracker) waitForSpace(p *pull, waiting bool) { p.noSpace.Store(waiting) }

// bytesRead notes that blob bytes arrived now.
func (p *pull) bytesRead() {
	now := time.Now().UnixNano()
	p.firstByte.CompareAndSwap(0, now)
	p.lastByte.Store(now)
}

// logTimeline says where a pull's time went, from when it was queued:
// waiting for a slot, the first and the last blob byte, every blob in, and
// the end, and what ticket priced it at (its cost: it is late from then
// on, and no longer passed over). Operators and the benchmarks read it to
// see where the tail of a burst of pulls goes.
func (p *pull) logTimeline(ctx context.Context, ticket *lane.Ticket) {
	since := func(ns int64) time.Duration {
		if ns == 0 {
			return 0
		}
		return time.Unix(0, ns).Sub(p.queued)
	}
	f := log.Fields{"image": p.image, "wait": p.started.Sub(p.queued), "total": time.Since(p.queued),
		"first_byte": since(p.firstByte.Load()), "last_byte": since(p.lastByte.Load())}
	if !p.fetched.IsZero() {
		f["fetched"] = p.fetched.Sub(p.queued)
	}
	if cost, ok := ticket.Cost(); ok {
		f["cost"] = cost
	}
	if n := p.lazyLayers.Load(); n > 0 {
		f["lazy_layers"] = n
	}
	// What its work waited for while other pulls' went on, summed.
	for name, d := range ticket.Waits {
		f[name] = d
	}
	log.G(ctx).WithFields(f).Info("image pull timeline")
}

func (t *tracker) add(key, image string, pod *runtime.PodSandboxMetadata) *pull {
	p := &pull{key: key, image: image, pod: pod, queued: time.Now(), progress: map[string]transfer.Progress{}}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pulls == nil {
		t.pulls = map[*pull]struct{}{}
	}
	t.pulls[p] = struct{}{}
	return p
}

func (t *tracker) remove(p *pull) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pulls, p)
}

func (t *tracker) start(p *pull) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.started = time.Now()
}

// sized notes the bytes a waiting pull has to fetch, known from its
// prefetched manifest before containerd reports any progress.
func (t *tracker) sized(p *pull, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.left = bytes
}

func (t *tracker) fetched(p *pull) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.fetched = time.Now()
}

// observe keeps the latest progress of each descriptor of a pull. Called
// on the pull's own goroutine, so it must stay cheap.
func (t *tracker) observe(p *pull, ev transfer.Progress) {
	if ev.Name == "" || ev.Total == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p.progress[ev.Name] = ev
}

func (t *tracker) list(callers func(key string) int) []PullStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	pulls := make([]*pull, 0, len(t.pulls))
	for p := range t.pulls {
		pulls = append(pulls, p)
	}
	slices.SortFunc(pulls, func(a, b *pull) int { return a.queued.Compare(b.queued) })
	out := make([]PullStatus, 0, len(pulls))
	for _, p := range pulls {
		s := PullStatus{Image: p.image, Pod: p.pod, State: StateWaiting, Waited: now.Sub(p.queued), Callers: callers(p.key)}
		if !p.started.IsZero() {
			s.State, s.Waited = StatePulling, p.started.Sub(p.queued)
		}
		if !p.fetched.IsZero() {
			s.State = StateUnpacking
		}
		if p.noSpace.Load() {
			// It had a slot, and gave it back until the disk has room.
			s.State = StateNoSpace
		}
		for _, ev := range p.progress {
			s.BytesDone += ev.Progress
			s.BytesTotal += ev.Total
		}
		if s.State == StateWaiting {
			s.BytesTotal = p.left
		}
		if rec := p.rec.Load(); rec != nil {
			s.BytesFromPeers = fromPeers(rec.Result())
		}
		out = append(out, s)
	}
	return out
}
