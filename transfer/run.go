package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/early"
	"github.com/pullwise/pullwise/transfer/gate"
	"github.com/pullwise/pullwise/transfer/imageref"
	"github.com/pullwise/pullwise/transfer/lane"
	"github.com/pullwise/pullwise/transfer/lazy"
	"github.com/pullwise/pullwise/transfer/peers"
	"github.com/pullwise/pullwise/transfer/pullctx"
	"github.com/pullwise/pullwise/transfer/source"
	"github.com/pullwise/pullwise/transfer/sourcelabel"
	"github.com/pullwise/pullwise/transfer/space"
)

// running is one run of a pull: what its steps share.
type running struct {
	s        *Service
	key, ref string
	cfg      *config
	p        *pull
	src      transfer.ImageFetcher
	rec      *source.Fetcher // nil: the source is not recorded
	dst      transfer.ImageStorer
	// desc is the reference's descriptor once the fast path resolved it.
	desc *ocispec.Descriptor
	// ticket places the pull in the gate's line and in the lanes
	// (lane.Ticket): by when it was asked for and, once known, its size.
	ticket *lane.Ticket
}

// slot is what a running pull holds.
type slot struct {
	release func() // gives the gate's slot back; safe to call again
	freed   func() // gives back the disk space admitted, once the pull is over
	need    space.Need
}

// run is one pull, shared by every identical caller. It counts its own
// outcome, since it may outlive the caller that started it.
func (s *Service) run(ctx context.Context, key string, src transfer.ImageFetcher, dst transfer.ImageStorer, progress func(transfer.Progress)) (err error) {
	r := &running{s: s, key: key, ref: imageOf(src), cfg: s.config.Load(), src: src, dst: dst}
	r.p = s.pulls.add(key, r.ref, pullctx.PodFrom(ctx))
	defer s.pulls.remove(r.p)
	outcome := OutcomePulled
	defer func() {
		if err != nil && outcome != OutcomeTimedOut && outcome != OutcomeDiskFull {
			outcome = OutcomeFailed
		}
		s.metrics.pulls.WithLabelValues(outcome).Inc()
		s.hub.Finish(key, err)
	}()

	// Source labels the pull will rewrite or keep, read before the transfer
	// image store wipes them.
	prev := s.previousLabels(ctx, dst, digestOf(r.ref))
	defer r.recorded(ctx)()
	// The records are labelled as they are stored (sourcelabel.Store);
	// recordSource then finds them labelled and writes nothing more.
	labels := func() map[string]string {
		var res source.Result
		if r.rec != nil {
			res = r.rec.Result()
		}
		return sourceLabels(res, prev)
	}
	ctx = sourcelabel.WithLabels(ctx, labels)

	fast, err := r.fastPath(ctx)
	if err != nil {
		return explain(err, r.rec)
	}
	if fast {
		outcome = OutcomeFastPath
		s.recordSource(ctx, dst, labels())
		s.offer(ctx, dst)
		return nil
	}

	r.ticket = lane.NewTicket(r.p.queued)
	held, ended, err := r.takeSlot(ctx)
	if err != nil {
		outcome = ended
		return err
	}
	defer held.freed()
	defer held.release()
	defer r.cfg.InFlight.Add(r.ticket)()
	turn := r.cfg.Handback.Start(r.ticket)
	defer turn.Done()
	defer func() {
		if err == nil {
			r.p.logTimeline(ctx, r.ticket)
		}
	}()

	tap := func(ev transfer.Progress) {
		s.pulls.observe(r.p, ev)
		s.hub.Update(key, ev)
		progress(ev)
	}
	expected := r.watch(ctx, progress, turn, held.release)
	defer expected()
	tctx := lazy.WithObserver(lane.WithTicket(ctx, r.ticket), s.lazyLayer(r.p, r.rec, tap))
	// Lines logged for the pull's layers, in a burst of pulls, say whose
	// layer it was.
	tctx = log.WithLogger(tctx, log.G(tctx).WithField("image", r.ref))
	// Only a pull that unpacks writes its large layers early: an image
	// stored without unpacking would be stored before they are in.
	if r.cfg.Early != nil && unpackPlatforms(dst) > 0 {
		var ep *early.Pull
		tctx, ep = r.cfg.Early.Start(tctx, r.ref, func(ctx context.Context) (remotes.Fetcher, error) {
			return r.src.Fetcher(ctx, r.ref)
		}, tap)
		defer func() { ep.End(err != nil) }()
	}
	if err := s.next.Transfer(tctx, r.src, dst, transfer.WithProgress(tap)); err != nil {
		if r.cfg.Space != nil {
			if full := r.cfg.Space.Explain(err, held.need); full != nil {
				outcome = OutcomeDiskFull
				return fmt.Errorf("pull %s: %w", r.ref, full)
			}
		}
		return explain(err, r.rec)
	}
	s.recordSource(ctx, dst, labels())
	s.offer(ctx, dst)
	return nil
}

// recorded rebuilds the pull's registry source as one that records who
// served it (transfer/source); a source that cannot be rebuilt is pulled
// as it is, unrecorded. It returns the func that closes it.
func (r *running) recorded(ctx context.Context) (closeSource func()) {
	cfg := r.cfg
	hosts := source.Hosts{Dirs: cfg.HostDirs, Health: cfg.Health, Downloads: cfg.Downloads, Link: cfg.Link}
	if cfg.Peers != nil {
		hosts.Peers, hosts.Arrivals = peers.NewTransport(cfg.Peers), cfg.Peers
	}
	f, ok, err := source.New(ctx, r.src, hosts)
	if err != nil {
		log.G(ctx).WithError(err).WithField("ref", r.ref).Warn("pull source will not be recorded")
	}
	if err != nil || !ok {
		return func() {}
	}
	r.src, r.rec = f, f
	r.p.rec.Store(f)
	return func() { f.Close() }
}

// fastPath completes the pull without a slot when it can (Service.fastPath).
// A tag it resolved is not asked of the registry twice.
func (r *running) fastPath(ctx context.Context) (bool, error) {
	desc, fast, err := r.s.fastPath(ctx, r.src, r.dst)
	if err != nil || fast {
		return fast, err
	}
	if desc != nil {
		r.desc = desc
		r.src = resolved{ImageFetcher: r.src, name: r.ref, desc: *desc}
	}
	return false, nil
}

// takeSlot waits for the pull's slot under the gate, in its ticket's
// place, and, with a disk check, for room on disk (Service.admit). A pull
// that waits fetches its image manifest meanwhile (startPrefetch): its
// size then places it in the line. A pull checked for disk space that did
// not wait fetches it under the slot, as containerd would, which then
// reads it from memory. On error the pull holds nothing, and ended is its
// outcome when it is not a plain failure.
func (r *running) takeSlot(ctx context.Context) (held slot, ended string, err error) {
	s, cfg := r.s, r.cfg
	bypass := cfg.bypass[imageref.Normalize(r.ref)]
	prefetchable := r.rec != nil && onePlatform(r.dst) && !bypass
	var pf *prefetch
	if prefetchable && cfg.Gate.Full() {
		pf = s.startPrefetch(ctx, r.p, r.rec, r.dst, r.desc, r.need)
	}
	release, waited, err := cfg.Gate.Acquire(lane.WithTicket(ctx, r.ticket), bypass)
	s.metrics.waitTime.Observe(waited.Seconds())
	if err == nil {
		s.pulls.start(r.p)
	}
	admit := cfg.Space != nil && prefetchable
	underSlot := false
	if err == nil && admit && pf == nil {
		pf, underSlot = s.startPrefetch(ctx, r.p, r.rec, r.dst, r.desc, r.need), true
	}
	if pf != nil {
		if d, ok := pf.wait(ctx, err != nil); ok && r.desc == nil {
			r.src = resolved{ImageFetcher: r.src, name: r.ref, desc: d}
		}
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrResourceExhausted) {
			ended = OutcomeTimedOut
		}
		return slot{}, ended, fmt.Errorf("pull %s: %w", r.ref, err)
	}
	if underSlot && pf.err != nil {
		// Every host has just answered what the pull would ask first (a
		// wrong password, a 403, hosts down): asking again at once would
		// double a failing pull's requests against stock's, for the same
		// answer. A prefetch made while waiting for a slot is older: the
		// pull asks again, as it would have.
		if f := r.rec.Failure(); f != nil {
			release()
			return slot{}, "", f
		}
	}
	held = slot{release: release, freed: func() {}}
	if !admit {
		return held, "", nil
	}
	held.need, held.freed, held.release, err = s.admit(lane.WithTicket(ctx, r.ticket), r.p, pf, r.dst, cfg, release)
	if err != nil {
		var full *space.FullError
		switch {
		case errors.As(err, &full):
			ended = OutcomeDiskFull
		case errors.Is(err, errdefs.ErrResourceExhausted):
			ended = OutcomeTimedOut
		}
		return slot{}, ended, fmt.Errorf("pull %s: %w", r.ref, err)
	}
	return held, "", nil
}

// watch has the recorder tell the running pull what it reads: bytes, as
// downloading events, and for a pull of one platform, when every blob is
// in, which layers it will not fetch, and what it has left, which the
// node's peers then expect it to fetch. The returned func, called when
// the pull ends, tells them it is over.
func (r *running) watch(ctx context.Context, progress func(transfer.Progress), turn *gate.Hold, release func()) (ended func()) {
	if r.rec == nil {
		return func() {}
	}
	s := r.s
	r.rec.OnBlobBytes(s.downloadTap(r.key, r.p, progress))
	if !onePlatform(r.dst) {
		return func() {}
	}
	// The slot bounds pulls talking to registries. Once every blob is in,
	// only unpacking is left, which the unpack lane orders and bounds: the
	// next pull may download meanwhile, so the link does not idle while
	// this one unpacks. A hand back, if any, keeps that to a few pulls at
	// a time.
	r.rec.OnFetched(s.local.present(ctx), func() {
		s.pulls.fetched(r.p)
		turn.Fetched(release)
	})
	// Layers whose snapshots exist are not fetched, though their blobs may
	// be gone (CRI's discard_unpacked_layers).
	r.rec.OnUnpacked(s.local.snapshotted(ctx, r.dst.(transfer.ImageUnpacker).UnpackPlatforms()[0]))
	// Downloads and unpacking serve first the pull that would be done
	// first, by when it was asked for and what it has left (lane.Ticket).
	r.rec.OnSize(r.need)
	if r.cfg.Peers == nil {
		return func() {}
	}
	var (
		mu   sync.Mutex
		done = func() {}
	)
	r.rec.OnBlobs(func(blobs []ocispec.Descriptor) {
		if keeper := r.cfg.Keep; keeper != nil {
			if err := keeper.Keep(ctx, blobs); err != nil {
				log.G(ctx).WithError(err).Warn("peers: blobs not kept")
			}
		}
		// The node's peers that ask for one of these meanwhile follow
		// this pull's download rather than go to the registry too.
		ds := make([]digest.Digest, len(blobs))
		for i, b := range blobs {
			ds[i] = b.Digest
		}
		mu.Lock()
		defer mu.Unlock()
		prev := done
		expect := r.cfg.Peers.Expect(ds...)
		done = func() { prev(); expect() }
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		done()
	}
}

// need places the pull's ticket by the cost of the layers it must fetch.
func (r *running) need(layers []ocispec.Descriptor) {
	r.ticket.Need(r.cfg.Costs.Of(layers))
}
