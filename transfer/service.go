// Package transfer wraps containerd's local transfer service. Every image
// pull on the node reaches it, whether it came from CRI, `ctr image pull` or
// the Pullwise API, which makes it the one place for node-wide pull
// behaviour: the fast path, dedupe, the pull gate, the progress tap, the
// source recorder and the memory of failing registry hosts.
package transfer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/distribution/reference"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/transfer/imageref"

	"github.com/pullwise/pullwise/transfer/dedupe"
	"github.com/pullwise/pullwise/transfer/early"
	"github.com/pullwise/pullwise/transfer/gate"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/hub"
	"github.com/pullwise/pullwise/transfer/lane"
	"github.com/pullwise/pullwise/transfer/lazy"
	"github.com/pullwise/pullwise/transfer/peers"
	"github.com/pullwise/pullwise/transfer/peers/keep"
	"github.com/pullwise/pullwise/transfer/pullctx"
	"github.com/pullwise/pullwise/transfer/pullkey"
	"github.com/pullwise/pullwise/transfer/source"
	"github.com/pullwise/pullwise/transfer/space"
)

// Service is a transfer.Transferrer that passes every transfer to the
// wrapped service and gives image pulls their own path.
type Service struct {
	next    transfer.Transferrer
	local   Local
	group   dedupe.Group
	pulls   tracker
	hub     hub.Hub
	metrics *metrics
	unique  atomic.Uint64 // keys for pulls that must not be shared

	config atomic.Pointer[config]
}

// Config is what the transfer service takes from the node's configuration.
type Config struct {
	// Gate limits pulls node-wide.
	Gate *gate.Gate
	// Bypass names images whose pulls skip the gate's queue: the sandbox
	// image, since no pod starts without it.
	Bypass []string
	// HostDirs are hosts.toml roots (each may be a ":"-separated list) for
	// pulls whose source names none.
	HostDirs []string
	// Health is the node's memory of failing registry hosts, shared by
	// every pull; nil remembers nothing.
	Health *health.Table
	// Downloads bounds blob downloads node-wide (max_concurrent_downloads)
	// and serves the oldest pull first; nil leaves containerd's FIFO
	// limiter in charge.
	Downloads *lane.Lane
	// Link gives the node's link to the pull that would finish first
	// (lane.Link); nil shares it by connection.
	Link *lane.Link
	// Costs turns the layers a pull must fetch into its cost, which
	// places it in line (lane.Ticket); nil: every pull is due when asked.
	Costs *lane.Costs
	// InFlight counts the pulls past the gate, whose work is ahead of
	// others' (lane.InFlight); nil counts none.
	InFlight *lane.InFlight
	// Handback decides when a pull whose blobs are in gives its slot
	// back; nil: at once.
	Handback *gate.Handback
	// Early writes a pull's large layers while they arrive
	// (transfer/early); nil writes every layer after its last byte.
	Early *early.Node
	// Unpacks names the snapshotters pulls can unpack into for the host
	// platform, as the transfer plugin configured them.
	Unpacks []string
	// Space admits pulls by the disk space they will take; nil admits
	// every pull.
	Space *space.Ledger
	// Ratio learns, from the layers unpacked, what a compressed byte
	// takes on disk unpacked, for Space.
	Ratio *space.Ratio
	// Peers, when set, are asked for every blob before the registries,
	// and learn the blobs of every image pulled (transfer/peers).
	Peers *peers.Node
	// Keep, with Peers, holds the blobs pulls fetch for the peers a while,
	// even where CRI discards them once unpacked.
	Keep *keep.Keeper
}

type config struct {
	Config
	bypass map[string]bool // normalized
}

// New wraps next; local is what fast paths check. Metrics go to reg. Until
// Configure is called, pulls are not limited.
func New(next transfer.Transferrer, local Local, reg prometheus.Registerer) (*Service, error) {
	s := &Service{next: next, local: local}
	s.Configure(Config{})
	m, err := newMetrics(reg,
		func() float64 { return float64(s.config.Load().Gate.Running()) },
		func() float64 { return float64(s.config.Load().Gate.Waiting()) })
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// Configure replaces the configuration; a nil Gate means no limit. Pulls
// already queued stay in the gate they joined.
func (s *Service) Configure(c Config) {
	if c.Gate == nil {
		c.Gate = gate.New(0, 0)
	}
	cfg := &config{Config: c, bypass: make(map[string]bool, len(c.Bypass))}
	for _, r := range c.Bypass {
		cfg.bypass[imageref.Normalize(r)] = true
	}
	s.config.Store(cfg)
}

// Config returns the configuration in force.
func (s *Service) Config() Config { return s.config.Load().Config }

// Hub is where the progress of pulls is published.
func (s *Service) Hub() *hub.Hub { return &s.hub }

// Pulls lists the pulls in flight or waiting, oldest first.
func (s *Service) Pulls() []PullStatus { return s.pulls.list(s.group.CallersOf) }

// Transfer implements transfer.Transferrer.
func (s *Service) Transfer(ctx context.Context, src, dst any, opts ...transfer.Opt) error {
	fetcher, isFetch := src.(transfer.ImageFetcher)
	storer, isStore := dst.(transfer.ImageStorer)
	if isFetch && isStore {
		return s.pull(ctx, fetcher, storer, opts)
	}
	return s.next.Transfer(ctx, src, dst, opts...)
}

func (s *Service) pull(ctx context.Context, src transfer.ImageFetcher, dst transfer.ImageStorer, opts []transfer.Opt) error {
	var cfg transfer.Config
	for _, o := range opts {
		o(&cfg)
	}
	key, ok, err := pullkey.Of(ctx, src, dst)
	if err != nil {
		log.G(ctx).WithError(err).Debug("pull cannot be shared")
	}
	if !ok {
		key = "unshared/" + strconv.FormatUint(s.unique.Add(1), 10)
	}
	share := func() (bool, error) {
		podUID := pullctx.PodFrom(ctx).GetUid()
		s.hub.Join(key, imageref.Normalize(imageOf(src)), podUID)
		defer s.hub.Leave(key, podUID)
		return s.group.Do(ctx, key, cfg.Progress, func(ctx context.Context, progress func(transfer.Progress)) error {
			return s.run(ctx, key, src, dst, progress)
		})
	}
	shared, err := share()
	// A run stores its image before it ends, and a removal in between
	// (CRI's RemoveImage collects at once) may come before a caller joins
	// it: that caller would be told its image is in when it is not. Stock,
	// sharing nothing, would have pulled for it; so does such a joiner,
	// once, and it counts as that pull, not as a deduped one.
	if shared && err == nil && ctx.Err() == nil && s.gone(ctx, dst) {
		log.G(ctx).WithField("image", imageOf(src)).Info("image removed during the pull this one joined: pulling again")
		_, err = share()
		return err
	}
	if shared {
		s.metrics.pulls.WithLabelValues(OutcomeDeduped).Inc()
	}
	return err
}

// gone reports whether an image a pull stored into dst has been removed
// since. It looks only for the names: a removal takes them, and a name
// there again was stored by a pull that holds its content. It says false
// when it cannot tell.
func (s *Service) gone(ctx context.Context, dst transfer.ImageStorer) bool {
	l, ok := dst.(transfer.ImageLookup)
	if !ok || s.local.Images == nil {
		return false
	}
	_, err := l.Lookup(ctx, s.local.Images)
	return errors.Is(err, errdefs.ErrNotFound)
}

// admit waits until the disk has room for what the pull, holding the
// slot release gives back, will write into dst (transfer/space). A pull
// that must wait for space gives its slot back meanwhile, and takes one
// again, in its ticket's place, once admitted; admit returns the release
// func of the slot it holds then, and freed, to call once the pull is
// over. On error the pull holds no slot. A pull whose prefetch failed is
// admitted as it is: nothing is known of its size.
func (s *Service) admit(ctx context.Context, p *pull, pf *prefetch, dst transfer.ImageStorer, cfg *config, release func()) (need space.Need, freed, held func(), err error) {
	if pf.err != nil {
		return need, func() {}, release, nil
	}
	need = space.Need{Layers: pf.layers, Snapshotter: dst.(transfer.ImageUnpacker).UnpackPlatforms()[0].Snapshotter}
	if need.Snapshotter == "" {
		// As containerd's transfer service picks it.
		need.Snapshotter = defaults.DefaultSnapshotter
	}
	gaveBack := false
	freed, err = cfg.Space.Admit(ctx, need, func() {
		release()
		gaveBack = true
		s.pulls.waitForSpace(p, true)
	})
	s.pulls.waitForSpace(p, false)
	if err != nil {
		release()
		return need, nil, nil, err
	}
	if gaveBack {
		var waited time.Duration
		release, waited, err = cfg.Gate.Acquire(ctx, false)
		s.metrics.waitTime.Observe(waited.Seconds())
		if err != nil {
			freed()
			return need, nil, nil, err
		}
	}
	return need, freed, release, nil
}

// lazyLayer is the pull p's observer of layers a remote snapshotter
// mounts (transfer/lazy). containerd sends no event for them and fetches
// nothing: they are shown done and lazy, counted, and no longer awaited
// by the slot's hand back.
func (s *Service) lazyLayer(p *pull, rec *source.Fetcher, tap func(transfer.Progress)) lazy.Observer {
	return func(layer digest.Digest) {
		var size int64
		if rec != nil {
			size = rec.MountedLazily(layer)
		}
		p.lazyLayers.Add(1)
		s.metrics.lazyLayers.Inc()
		tap(transfer.Progress{Event: hub.EventLazy, Name: "layer-" + layer.String(), Progress: size, Total: size})
	}
}

// onePlatform reports whether dst unpacks one platform: only then is a
// pull's set of blobs known once its image manifest is.
func onePlatform(dst transfer.ImageStorer) bool { return unpackPlatforms(dst) == 1 }

// unpackPlatforms is how many platforms a pull into dst unpacks.
func unpackPlatforms(dst transfer.ImageStorer) int {
	u, ok := dst.(transfer.ImageUnpacker)
	if !ok {
		return 0
	}
	return len(u.UnpackPlatforms())
}

// downloadTap turns bytes read from the registry into "downloading" events
// for the hub, ListPulls and the caller: containerd itself reports none
// while it unpacks a layer as it arrives, and CRI cancels pulls that show
// no progress for image_pull_progress_timeout. The caller gets one event
// per layer per progressInterval at most.
func (s *Service) downloadTap(key string, p *pull, progress func(transfer.Progress)) func(string, int64) {
	var (
		mu   sync.Mutex
		sent = map[string]time.Time{}
	)
	return func(dgst string, n int64) {
		p.bytesRead()
		e, ok := s.hub.Downloaded(key, dgst, n)
		if !ok {
			return
		}
		ev := transfer.Progress{Event: "downloading", Name: "layer-" + dgst, Progress: e.Progress, Total: e.Total}
		s.pulls.observe(p, ev)
		mu.Lock()
		due := time.Since(sent[dgst]) >= progressInterval || e.Progress == e.Total
		if due {
			sent[dgst] = time.Now()
		}
		mu.Unlock()
		if due {
			progress(ev)
		}
	}
}

// explain replaces containerd's error for a pull that no registry host
// could serve, which names only the first host it tried, with one that
// names every host and its answer. Other errors stay as they are.
func explain(err error, rec *source.Fetcher) error {
	if rec == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if f := rec.Failure(); f != nil {
		return f
	}
	return err
}

// progressInterval matches the period of containerd's own progress events.
const progressInterval = 300 * time.Millisecond

// recordSource labels what a successful pull stored with where it came
// from, where the store did not (sourcelabel.Store). A failure to label
// does not fail the pull: the image is there.
func (s *Service) recordSource(ctx context.Context, dst transfer.ImageStorer, labels map[string]string) {
	if err := s.labelStored(ctx, dst, labels); err != nil {
		log.G(ctx).WithError(err).Warn("pull source not recorded")
	}
}

// fastPath completes a pull without a slot when the image is present and
// unpacked for every platform the destination wants: a digest reference
// with no request at all, a tag with one resolve (HEAD) whose digest is
// unchanged. It then stores the image as the pull would have, so names
// and labels end up the same. When it resolved the tag but cannot finish,
// it returns the descriptor for the full pull to reuse; when the resolve
// fails, its error is the pull's.
func (s *Service) fastPath(ctx context.Context, src transfer.ImageFetcher, dst transfer.ImageStorer) (*ocispec.Descriptor, bool, error) {
	unpacker, ok := dst.(transfer.ImageUnpacker)
	if !ok || s.local.Images == nil {
		return nil, false, nil
	}
	ref := imageOf(src)
	target, present, err := s.local.localTarget(ctx, ref)
	if err != nil || !present {
		return nil, false, err
	}
	desc := target
	if !isDigest(ref) {
		_, d, err := src.Resolve(ctx)
		if err != nil {
			// The resolve a full pull would make has been made, and every
			// host has answered it: resolving again would double the
			// requests of a failing pull (a wrong password, a 429, a 503)
			// against stock's, for the same error. Worded as containerd's
			// local transfer words it.
			return nil, false, fmt.Errorf("failed to resolve image: %w", err)
		}
		desc = d
		if d.Digest != target.Digest {
			return &desc, false, nil
		}
	}
	// The full pull reuses the resolve, when there was one.
	full := &desc
	if isDigest(ref) {
		full = nil
	}
	unpacked, err := s.local.unpacked(ctx, desc, unpacker.UnpackPlatforms())
	if err != nil || !unpacked {
		return full, false, nil
	}
	if !s.stored(ctx, dst, desc) {
		if _, err := dst.Store(ctx, desc, s.local.Images); err != nil {
			return nil, false, fmt.Errorf("store %s: %w", ref, err)
		}
		// No lease keeps what was checked above: an image removed
		// meanwhile (CRI's RemoveImage collects at once) may have taken
		// it, and the records just stored would name what is gone. Once
		// stored, they keep what is still there, so a second look tells.
		if unpacked, err := s.local.unpacked(ctx, desc, unpacker.UnpackPlatforms()); err != nil || !unpacked {
			return full, false, nil
		}
	}
	log.G(ctx).WithField("ref", ref).WithField("digest", desc.Digest).Debug("pull served from the local store")
	return nil, true, nil
}

// stored reports whether the destination's records exist with target
// already. Storing again would rewrite them and wipe their labels.
func (s *Service) stored(ctx context.Context, dst transfer.ImageStorer, target ocispec.Descriptor) bool {
	l, ok := dst.(transfer.ImageLookup)
	if !ok {
		return false
	}
	recs, err := l.Lookup(ctx, s.local.Images)
	if err != nil || len(recs) == 0 {
		return false
	}
	for _, r := range recs {
		if r.Target.Digest != target.Digest {
			return false
		}
	}
	return true
}

func imageOf(src any) string {
	if n, ok := src.(interface{ Image() string }); ok {
		return n.Image()
	}
	return fmt.Sprint(src)
}

func isDigest(ref string) bool { return digestOf(ref) != "" }

// digestOf returns the digest of a digest reference, else "".
func digestOf(ref string) digest.Digest {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return ""
	}
	if d, ok := named.(reference.Digested); ok {
		return d.Digest()
	}
	return ""
}

// resolved is a pull source whose resolve already happened. It keeps the
// source's other faces: the download limiter reaches the source through
// SetResolverOptions, and progress names it through String.
type resolved struct {
	transfer.ImageFetcher
	name string
	desc ocispec.Descriptor
}

func (r resolved) Resolve(context.Context) (string, ocispec.Descriptor, error) {
	return r.name, r.desc, nil
}

func (r resolved) SetResolverOptions(opts ...transfer.ImageResolverOption) {
	if s, ok := r.ImageFetcher.(transfer.ImageResolverOptionSetter); ok {
		s.SetResolverOptions(opts...)
	}
}

func (r resolved) String() string { return fmt.Sprint(r.ImageFetcher) }

func (r resolved) Image() string { return r.name }
