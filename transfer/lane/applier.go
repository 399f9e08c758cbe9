package lane

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Applier applies layers through a lane. containerd's unpacker calls Apply
// once a layer's download is done, so a place is held only while the
// layer is being written, never while it is still on the network. What
// each layer took, pauses left out, teaches Costs.
type Applier struct {
	diff.Applier
	Lane   *Lane
	Costs  *Costs  // nil: nothing learned
	Guards *Guards // nil: no layer is known by the lock it is written under
}

// Apply implements diff.Applier. The layer's reader may be paced
// (PacerOf), for the pulls ahead of it.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	asked := time.Now()
	guard := a.Guards.lockOf(mounts)
	h, err := a.Lane.acquire(ctx, guard)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("wait to unpack %s: %w", desc.Digest, err)
	}
	defer a.Lane.releaser(h)()
	started := time.Now()
	ctx, pacer := withPacer(ctx, a.Lane, h)
	applied, err := a.Applier.Apply(ctx, desc, mounts, opts...)
	waited, paused, starved := started.Sub(asked), pacer.Paused(), starvedOf(ctx)
	wrote := time.Since(started) - paused - starved
	t := TicketOf(ctx)
	t.Waited(WaitUnpack, waited)
	t.Waited(WaitPace, paused)
	if err == nil {
		a.Costs.Wrote(desc.MediaType, desc.Size, wrote)
	}
	logger := log.G(ctx)
	if !logger.Logger.IsLevelEnabled(log.DebugLevel) {
		// Its fields would be built for every layer only to be dropped.
		return applied, err
	}
	fields := log.Fields{
		"layer":   desc.Digest,
		"waited":  waited,
		"paused":  paused,
		"starved": starved,
		"wrote":   wrote,
		// extra: the place was one beyond the lane's limit (Extra), which
		// says who passed whom when layers wait.
		"extra": h != nil && h.extra,
	}
	if guard != "" {
		// under: the chain lock the layer was written under, which an
		// image sharing the chain may have waited on.
		fields["under"] = guard
	}
	if h != nil && h.queued != nil {
		// The lane as the layer found it when it had to wait.
		q := h.queued
		fields["queued_running"], fields["queued_extra"] = q.running, q.extra
		fields["queued_late"], fields["queued_lead"] = q.late, q.lead
	}
	logger.WithFields(fields).Debug("layer unpacked in its lane")
	return applied, err
}

type earlyKey struct{}

// WrittenEarly marks ctx's layer as written while its blob arrives
// (transfer/early), which only moves earlier what would otherwise run
// after its last byte. Its Pacer gives way to every pull ahead in flight,
// whatever the pressure; starved says how long its reader has waited for
// bytes still on the network, which teaches Costs nothing.
func WrittenEarly(ctx context.Context, starved func() time.Duration) context.Context {
	return context.WithValue(ctx, earlyKey{}, starved)
}

// writtenEarly reports whether ctx's layer is WrittenEarly, and how long
// its reader has starved so far.
func writtenEarly(ctx context.Context) (starved func() time.Duration, ok bool) {
	starved, ok = ctx.Value(earlyKey{}).(func() time.Duration)
	return starved, ok
}

func starvedOf(ctx context.Context) time.Duration {
	if starved, ok := writtenEarly(ctx); ok {
		return starved()
	}
	return 0
}
