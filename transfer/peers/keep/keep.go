// Package keep holds the blobs a node pulled for its peers for a while,
// within a byte budget, even where the node itself lets them go once
// unpacked (CRI's discard_unpacked_layers, as EKS, GKE and Talos set it).
// Each pull's blobs get one containerd lease, which the garbage collector
// honours until the lease expires or the budget drops it, oldest first.
// The peers announce only what the content store still holds, so a blob
// let go is never advertised for long (transfer/peers).
package keep

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Label marks the leases a Keeper made.
const Label = "io.pullwise.peers.keep"

// Keeper holds pulls' blobs for the node's peers.
type Keeper struct {
	leases  leases.Manager
	keepFor time.Duration
	budget  int64

	mu    sync.Mutex
	kept  []kept // oldest first
	bytes int64
}

// kept is one pull's lease.
type kept struct {
	ns, id string
	bytes  int64
	until  time.Time
}

// New keeps blobs for keepFor, and no more than budget bytes of them.
func New(lm leases.Manager, keepFor time.Duration, budget int64) *Keeper {
	return &Keeper{leases: lm, keepFor: keepFor, budget: budget}
}

// Keep holds blobs, which may not be in the content store yet: a lease
// names content by digest, and the collector keeps what it names once it
// is there. ctx carries the pull's namespace.
func (k *Keeper) Keep(ctx context.Context, blobs []ocispec.Descriptor) error {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return err
	}
	var size int64
	for _, b := range blobs {
		size += b.Size
	}
	if len(blobs) == 0 || size > k.budget {
		return nil
	}
	l, err := k.leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(k.keepFor), leases.WithLabel(Label, "true"))
	if err != nil {
		return fmt.Errorf("keep blobs for peers: %w", err)
	}
	for _, b := range blobs {
		if err := k.leases.AddResource(ctx, l, leases.Resource{ID: b.Digest.String(), Type: "content"}); err != nil {
			k.leases.Delete(ctx, l)
			return fmt.Errorf("keep %s for peers: %w", b.Digest, err)
		}
	}
	k.mu.Lock()
	k.kept = append(k.kept, kept{ns: ns, id: l.ID, bytes: size, until: time.Now().Add(k.keepFor)})
	k.bytes += size
	drop := k.overBudget(time.Now())
	k.mu.Unlock()
	for _, d := range drop {
		// The collector would end an expired lease anyway; one dropped
		// for the budget ends now.
		if err := k.leases.Delete(namespaces.WithNamespace(context.WithoutCancel(ctx), d.ns), leases.Lease{ID: d.id}); err != nil {
			log.G(ctx).WithError(err).WithField("lease", d.id).Debug("peers: let kept blobs go")
		}
	}
	return nil
}

// overBudget takes the expired leases, and the oldest beyond the budget,
// off the books, and returns those still to delete.
func (k *Keeper) overBudget(now time.Time) []kept {
	var drop []kept
	for len(k.kept) > 0 && (k.bytes > k.budget || !now.Before(k.kept[0].until)) {
		d := k.kept[0]
		k.kept = k.kept[1:]
		k.bytes -= d.bytes
		if now.Before(d.until) {
			drop = append(drop, d)
		}
	}
	return drop
}

// Bytes is what the keeper holds now, by its books.
func (k *Keeper) Bytes() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.bytes
}
