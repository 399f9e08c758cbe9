package peers

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/containerd/log"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// provideTimeout bounds one announcement of one digest in the DHT.
const provideTimeout = 30 * time.Second

// Advertise announces that the node serves dgst, which its store must
// hold. The node announces it again every RecordTTL/2 while the store
// still holds it, until Forget: a blob garbage collection removed drops
// out of the DHT within RecordTTL, and the server refuses it at once.
// The digest stays advertised when the announcement fails (no peer yet,
// say); the next round retries.
func (n *Node) Advertise(ctx context.Context, dgst digest.Digest) error {
	c, err := blobCID(dgst)
	if err != nil {
		return err
	}
	if !n.holds(ctx, dgst) {
		return fmt.Errorf("peers: advertise %s: not in the content store", dgst)
	}
	n.mu.Lock()
	n.held[dgst] = struct{}{}
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, provideTimeout)
	defer cancel()
	if err := n.dht.Provide(ctx, c, true); err != nil {
		return fmt.Errorf("peers: advertise %s: %w", dgst, err)
	}
	return nil
}

// Forget stops announcing dgst; records already in the DHT expire within
// RecordTTL.
func (n *Node) Forget(dgst digest.Digest) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.held, dgst)
}

// holds reports whether the store can serve dgst now.
func (n *Node) holds(ctx context.Context, dgst digest.Digest) bool {
	ra, err := n.store.ReaderAt(ctx, ocispec.Descriptor{Digest: dgst})
	if err != nil {
		return false
	}
	ra.Close()
	return true
}

// Offer advertises dgsts without waiting on the DHT: the announce loop
// announces those not yet held at once, and all of them again while the
// store holds them. A pull offers its blobs as it ends, and must not wait
// for a DHT that may take seconds to reach in a large cluster.
func (n *Node) Offer(dgsts ...digest.Digest) {
	n.mu.Lock()
	for _, d := range dgsts {
		if _, ok := n.held[d]; !ok {
			n.held[d] = struct{}{}
			n.fresh = append(n.fresh, d)
		}
	}
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// reprovideLoop announces what is offered as it comes, and every
// RecordTTL/2 again what is advertised and still held; it forgets what
// the store no longer has.
func (n *Node) reprovideLoop() {
	t := time.NewTicker(n.cfg.RecordTTL / 2)
	defer t.Stop()
	for {
		var ds []digest.Digest
		select {
		case <-n.ctx.Done():
			return
		case <-n.wake:
			n.mu.Lock()
			ds, n.fresh = n.fresh, nil
			n.mu.Unlock()
		case <-t.C:
			n.mu.Lock()
			for d := range n.held {
				ds = append(ds, d)
			}
			n.mu.Unlock()
		}
		n.announce(ds)
	}
}

// announce provides each of ds the store still holds, and forgets the
// others.
func (n *Node) announce(ds []digest.Digest) {
	for _, d := range ds {
		if n.ctx.Err() != nil {
			return
		}
		if !n.holds(n.ctx, d) {
			n.Forget(d)
			continue
		}
		c, err := blobCID(d)
		if err != nil {
			n.Forget(d)
			continue
		}
		ctx, cancel := context.WithTimeout(n.ctx, provideTimeout)
		if err := n.dht.Provide(ctx, c, true); err != nil {
			log.G(ctx).WithError(err).Debugf("peers: announce %s", d)
		} else {
			n.stats.announced.Add(1)
		}
		cancel()
	}
}

// blobCID is the DHT key of a blob: its digest as a raw CIDv1, so the
// key is the digest itself, which a peer can check against the bytes.
func blobCID(d digest.Digest) (cid.Cid, error) {
	if err := d.Validate(); err != nil {
		return cid.Undef, fmt.Errorf("peers: %w", err)
	}
	var code uint64
	switch d.Algorithm() {
	case digest.SHA256:
		code = multihash.SHA2_256
	case digest.SHA512:
		code = multihash.SHA2_512
	default:
		return cid.Undef, fmt.Errorf("peers: digest algorithm %s not supported", d.Algorithm())
	}
	raw, err := hex.DecodeString(d.Encoded())
	if err != nil {
		return cid.Undef, fmt.Errorf("peers: %w", err)
	}
	mh, err := multihash.Encode(raw, code)
	if err != nil {
		return cid.Undef, fmt.Errorf("peers: %w", err)
	}
	return cid.NewCidV1(cid.Raw, mh), nil
}
