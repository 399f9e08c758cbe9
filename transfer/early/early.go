// Package early writes a large layer while its blob arrives, rather than
// after its last byte.
//
// containerd's unpacker applies a layer once its download is done (each
// layer of core/unpack waits for its own fetch), so on a link slower
// than the disk an image's largest layer is written on one CPU after the
// last byte of the burst, and the image is done seconds after its bytes
// (docs/benchmarks-history.md has the runs). Here a pull fetches such a layer itself,
// in the background, and lets the unpacker go on to apply it at once
// (Node.Handler). The applier reads the bytes as they arrive, from a
// spool file the download writes beside the content store's ingest
// (Provider), and the layer is not done until its blob is committed to
// the content store, its digest checked (Applier). A layer whose
// download fails fails its apply, as it would have failed its fetch.
//
// A write that catches up with its bytes waits for them, holding an
// unpack place, so the apply asks for its place only once what has
// arrived would take as long to write as the rest takes to arrive
// (arrival.ready): the write then ends about when the last byte comes,
// and its place is seldom left waiting. Nor does it start while a pull
// due before its own is in flight (Node.Yield), nor go on (the lane's
// Pacer, told by lane.WrittenEarly): written early, it would take from
// that pull the CPUs and the disk it otherwise leaves to it.
package early

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// MinSize is the smallest blob written while it arrives. Below it the
// write after the last byte takes under half a second at the speeds this
// node class writes gzip layers (about 120 MiB/s per CPU), less than a
// burst's run-to-run noise, and the layers transfer/gunzip inflates whole
// (16 MiB and below), far cheaper than streamed, are well clear of it.
// A var for tests.
var MinSize int64 = 64 << 20

// Node is what the node's pulls share: where blobs are committed, where
// arrivals are spooled, and which blobs are arriving now.
type Node struct {
	// Content is the store the transfer service fetches into.
	Content content.Store
	// Dir holds the spool files, removed as soon as they are made; ""
	// means os.TempDir().
	Dir string
	// Cost is what writing size bytes of a layer of mediaType takes on
	// this node (lane.Costs.Of); nil starts every write at once.
	Cost func(mediaType string, size int64) time.Duration
	// Yield waits while pulls due before ctx's are in flight
	// (lane.InFlight.Yield); nil never waits.
	Yield func(ctx context.Context) error

	mu     sync.Mutex
	active map[digest.Digest]*arrival // downloads in the background, any pull's
}

// Handler is a base handler of the transfer service's pulls: it starts
// the download of a large layer of a pull that asked for it (Start) and
// stops the handlers after it, containerd's fetch among them, so that the
// unpacker goes on to apply the layer. Any other blob is left to them;
// one arriving for another pull is waited for first, as containerd's own
// lock on a blob's fetch would.
func (n *Node) Handler(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	if !images.IsLayerType(desc.MediaType) || images.IsNonDistributable(desc.MediaType) || desc.Size < MinSize {
		return nil, nil
	}
	if other := n.arriving(desc.Digest); other != nil {
		return nil, other.wait(ctx)
	}
	p := pullOf(ctx)
	if p == nil {
		return nil, nil
	}
	if _, err := n.Content.Info(ctx, desc.Digest); err == nil {
		return nil, nil
	}
	started, err := p.start(ctx, desc)
	if err != nil || !started {
		return nil, err
	}
	return nil, images.ErrStopHandler
}

// arriving returns the blob's download in the background, or nil.
func (n *Node) arriving(d digest.Digest) *arrival {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.active[d]
}

// Pull is one pull's downloads in the background. It owns them: End
// waits for them to end.
type Pull struct {
	node     *Node
	name     string
	fetcher  func() (remotes.Fetcher, error) // once
	progress func(transfer.Progress)
	// life ends with the pull: its downloads are cancelled then.
	life context.Context
	stop context.CancelFunc

	wg       sync.WaitGroup
	mu       sync.Mutex
	arrivals map[digest.Digest]*arrival
}

type pullKey struct{}

// Start returns ctx marked with a pull of name whose large layers are
// written while they arrive, fetched with what fetcher returns, their
// waiting and complete events sent to progress. The caller must End it.
func (n *Node) Start(ctx context.Context, name string, fetcher func(context.Context) (remotes.Fetcher, error), progress func(transfer.Progress)) (context.Context, *Pull) {
	life, stop := context.WithCancel(context.WithoutCancel(ctx))
	p := &Pull{
		node:     n,
		name:     name,
		fetcher:  sync.OnceValues(func() (remotes.Fetcher, error) { return fetcher(life) }),
		progress: progress,
		life:     life,
		stop:     stop,
		arrivals: map[digest.Digest]*arrival{},
	}
	return context.WithValue(ctx, pullKey{}, p), p
}

func pullOf(ctx context.Context) *Pull {
	p, _ := ctx.Value(pullKey{}).(*Pull)
	return p
}

// End ends the pull's downloads: a pull that failed cancels them, one
// that did not waits for them, since containerd may have stored its
// image without applying a layer (its snapshot was made meanwhile by
// another pull) and the blob is still the image's. Then the spool files
// are closed.
func (p *Pull) End(failed bool) {
	if failed {
		p.stop()
	}
	p.wg.Wait()
	p.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for d, a := range p.arrivals {
		a.close()
		delete(p.arrivals, d)
	}
}

// arrival returns the pull's download of d in the background, or nil.
func (p *Pull) arrival(d digest.Digest) *arrival {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.arrivals[d]
}

// start downloads desc in the background, unless another pull's
// download of it started first; it then waits for that one and reports
// false, and containerd's handlers fetch what is left to fetch.
func (p *Pull) start(ctx context.Context, desc ocispec.Descriptor) (bool, error) {
	n := p.node
	a, err := newArrival(n.Dir, desc, n.Content)
	if err != nil {
		log.G(ctx).WithError(err).WithField("layer", desc.Digest).Warn("layer written after its download: no spool file")
		return false, nil
	}
	n.mu.Lock()
	if n.active == nil {
		n.active = map[digest.Digest]*arrival{}
	}
	if other := n.active[desc.Digest]; other != nil {
		n.mu.Unlock()
		a.close()
		return false, other.wait(ctx)
	}
	n.active[desc.Digest] = a
	n.mu.Unlock()
	p.mu.Lock()
	p.arrivals[desc.Digest] = a
	p.mu.Unlock()

	// The download keeps the handler's values (the pull's lease, its
	// ticket in the lanes, its logger) but not its cancellation: the
	// unpacker ends the handler's context as soon as every handler has
	// returned. The pull's end cancels it instead.
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	stopAfter := context.AfterFunc(p.life, cancel)
	p.send(dctx, "waiting", desc, 0)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer cancel()
		defer stopAfter()
		err := p.download(dctx, a)
		n.mu.Lock()
		if n.active[desc.Digest] == a {
			delete(n.active, desc.Digest)
		}
		n.mu.Unlock()
		a.end(err)
		if err == nil {
			p.send(dctx, "complete", desc, desc.Size)
		}
	}()
	return true, nil
}

// download fetches a's blob into the content store, as containerd's fetch
// handler and the handlers after it would: the blob, then its
// distribution source label.
func (p *Pull) download(ctx context.Context, a *arrival) error {
	f, err := p.fetcher()
	if err != nil {
		return fmt.Errorf("fetcher for %s: %w", p.name, err)
	}
	err = remotes.Fetch(ctx, tee{Ingester: p.node.Content, a: a}, f, a.desc)
	if err != nil && !errdefs.IsAlreadyExists(err) {
		return fmt.Errorf("fetch %s: %w", a.desc.Digest, err)
	}
	label, err := docker.AppendDistributionSourceLabel(p.node.Content, p.name)
	if err == nil {
		_, err = label(ctx, a.desc)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.G(ctx).WithError(err).WithField("layer", a.desc.Digest).Warn("distribution source label not set")
	}
	return nil
}

// send reports a layer's event as containerd's progress tracker would,
// which does not see the layers fetched here.
func (p *Pull) send(ctx context.Context, event string, desc ocispec.Descriptor, progress int64) {
	if p.progress == nil {
		return
	}
	p.progress(transfer.Progress{
		Event:    event,
		Name:     remotes.MakeRefKey(ctx, desc),
		Progress: progress,
		Total:    desc.Size,
		Desc:     &desc,
	})
}
