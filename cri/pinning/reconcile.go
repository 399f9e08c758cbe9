package pinning

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/transfer/imageref"
)

// imageEvents selects what can change which records config pins: a record
// created (pull, import, CRI's own ID record), updated (a re-pull replaces
// labels and may move a tag) or deleted (the named record of an image is
// gone, so its other names no longer are what config names).
const imageEvents = `namespace=="` + criconfig.Namespace + `",topic~="^/images/"`

// retryDelay is how long Watch waits before retrying a failed pass when no
// event comes first.
const retryDelay = time.Second

// labelPaths are the only fields a pass writes, so that concurrent writers'
// target and other labels survive.
var labelPaths = []string{"labels." + PinnedLabel, "labels." + MarkerLabel}

// Reconciler makes the pin labels of the records in CRI's namespace follow Pins.
type Reconciler struct {
	store images.Store
	pins  *Pins

	// What the last full pass found pinned: an image event that touches
	// none of it, nor a name config pins, changes no pin, so it needs no
	// pass. Without this a burst of N pulls or imports would list the
	// whole store N times.
	mu            sync.Mutex
	pinnedNames   map[string]bool // pinned by config or carrying the marker
	pinnedTargets map[digest.Digest]bool
}

// NewReconciler returns a Reconciler writing to store. For the CRI plugin to
// see its changes, store must publish image events, as containerd's metadata
// image store does.
func NewReconciler(store images.Store, pins *Pins) *Reconciler {
	return &Reconciler{store: store, pins: pins}
}

// Changes lists the records a pass pinned and unpinned.
type Changes struct {
	Pinned   []string
	Unpinned []string
}

// Reconcile makes one pass over CRI's namespace:
//   - records config pins get PinnedLabel and MarkerLabel. A record that is
//     pinned without the marker gets the marker too, since upstream CRI pins
//     exact config names itself without one and those pins must go when
//     config moves on;
//   - records carrying the marker that config no longer pins lose both labels;
//   - pins without the marker on records config does not pin are an
//     operator's and are left alone.
//
// Records already right are not written: every write publishes an
// /images/update event, which would otherwise trigger the next pass forever.
// A failed write does not stop the pass; the errors are returned joined.
func (r *Reconciler) Reconcile(ctx context.Context) (Changes, error) {
	ctx = namespaces.WithNamespace(ctx, criconfig.Namespace)
	records, err := r.store.List(ctx)
	if err != nil {
		return Changes{}, fmt.Errorf("list images in namespace %s: %w", criconfig.Namespace, err)
	}
	plan := r.pins.plan(records)
	r.remember(records, plan)

	var (
		changes Changes
		errs    []error
	)
	for _, rec := range records {
		keys, pin := plan[rec.Name]
		var labels map[string]string
		switch {
		case pin && !isPinnedByUs(rec):
			labels = map[string]string{PinnedLabel: PinnedValue, MarkerLabel: MarkerValue}
		case !pin && isMarked(rec):
			// Absent values in labels remove both labels.
		default:
			continue
		}
		_, err := r.store.Update(ctx, images.Image{Name: rec.Name, Labels: labels}, labelPaths...)
		switch {
		case errdefs.IsNotFound(err):
			// Deleted since the list; its delete event brings another pass.
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("update pin labels of image %q: %w", rec.Name, err))
			continue
		}
		if pin {
			log.G(ctx).WithField("image", rec.Name).Infof("pinned image: named by pinned_images.%s", strings.Join(keys, ", pinned_images."))
			changes.Pinned = append(changes.Pinned, rec.Name)
		} else {
			log.G(ctx).WithField("image", rec.Name).Info("unpinned image: pinned_images no longer names it")
			changes.Unpinned = append(changes.Unpinned, rec.Name)
		}
	}
	return changes, errors.Join(errs...)
}

// remember keeps what a pass found pinned, for concerns.
func (r *Reconciler) remember(records []images.Image, plan map[string][]string) {
	names, targets := map[string]bool{}, map[digest.Digest]bool{}
	for _, rec := range records {
		if _, pin := plan[rec.Name]; pin {
			names[rec.Name], targets[rec.Target.Digest] = true, true
		} else if isMarked(rec) {
			names[rec.Name] = true
		}
	}
	r.mu.Lock()
	r.pinnedNames, r.pinnedTargets = names, targets
	r.mu.Unlock()
}

// concerns reports whether an event about the record name can change a
// pin: the record was pinned or marked at the last pass, config names it,
// or it now points at a pinned target or carries the marker. One lookup by
// name, not a listing.
func (r *Reconciler) concerns(ctx context.Context, name string) bool {
	r.mu.Lock()
	known := r.pinnedNames[name]
	r.mu.Unlock()
	if known || len(r.pins.byName[imageref.Normalize(name)]) > 0 {
		return true
	}
	rec, err := r.store.Get(namespaces.WithNamespace(ctx, criconfig.Namespace), name)
	if errdefs.IsNotFound(err) {
		return false
	}
	if err != nil {
		return true // cannot tell: a pass is always right
	}
	r.mu.Lock()
	pinnedTarget := r.pinnedTargets[rec.Target.Digest]
	r.mu.Unlock()
	return pinnedTarget || len(r.pins.byDigest[rec.Target.Digest]) > 0 || isMarked(rec)
}

// eventImage is the record name an image event is about, or "" when the
// event cannot be read.
func eventImage(env *events.Envelope) string {
	if env == nil || env.Event == nil {
		return ""
	}
	ev, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		return ""
	}
	switch e := ev.(type) {
	case *eventstypes.ImageCreate:
		return e.Name
	case *eventstypes.ImageUpdate:
		return e.Name
	case *eventstypes.ImageDelete:
		return e.Name
	}
	return ""
}

// Watch reconciles once, then after image events in CRI's namespace, until ctx
// ends. It subscribes before the first pass, so that a record created during
// that pass is not missed. Events arriving during a pass are coalesced into
// one more pass. A failed pass is logged and retried on the next event or
// after retryDelay, whichever comes first.
//
// Watch returns nil when ctx ends, and an error if the subscription ends
// first.
func (r *Reconciler) Watch(ctx context.Context, subscriber events.Subscriber) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the subscription when the subscription did not end Watch
	envelopes, errs := subscriber.Subscribe(ctx, imageEvents)

	var retry <-chan time.Time
	pass := func() {
		retry = nil
		if _, err := r.Reconcile(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.G(ctx).WithError(err).Warnf("reconciling pinned images failed; retrying in %s", retryDelay)
			retry = time.After(retryDelay)
		}
	}

	pass()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				err = errors.New("closed by the event exchange")
			}
			return fmt.Errorf("image event subscription ended: %w", err)
		case env := <-envelopes:
			batch := append(drain(envelopes), env)
			if slices.ContainsFunc(batch, func(e *events.Envelope) bool {
				name := eventImage(e)
				return name == "" || r.concerns(ctx, name)
			}) {
				pass()
			}
		case <-retry:
			pass()
		}
	}
}

// drain takes the envelopes already waiting: one pass covers them all.
func drain(envelopes <-chan *events.Envelope) []*events.Envelope {
	var batch []*events.Envelope
	for {
		select {
		case env := <-envelopes:
			batch = append(batch, env)
		default:
			return batch
		}
	}
}
