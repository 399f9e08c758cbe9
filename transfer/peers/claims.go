package peers

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/opencontainers/go-digest"
)

// claimTTL is how long a node told to fetch a digest from its registry
// stays the one its owner sends the others to: far longer than a layer
// takes to start downloading, and the claimant's own expectation ends
// its serving sooner if its pull ends.
const claimTTL = 2 * time.Minute

// claims are, for the digests this node owns (Owner), the peer it told to
// fetch each from the registry. The owner coordinates a digest whether or
// not it pulls the image itself: the first peer to ask fetches it, and
// every later one is sent to follow that peer's download, so a rollout
// to nodes that do not include the owner still costs one copy.
type claims struct {
	mu sync.Mutex
	by map[digest.Digest]claim
}

type claim struct {
	peer  peer.ID
	until time.Time
}

// holder returns the live claimant of d, or "".
func (c *claims) holder(d digest.Digest, now time.Time) peer.ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.by[d]; ok && now.Before(cl.until) {
		return cl.peer
	}
	return ""
}

// replace makes p the claimant of d if stale still is.
func (c *claims) replace(d digest.Digest, stale, p peer.ID, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.by[d]; ok && cl.peer == stale {
		c.by[d] = claim{peer: p, until: now.Add(claimTTL)}
	}
}

// claim returns the live claimant of d other than p; when there is none,
// p becomes it and claim returns "".
func (c *claims) claim(d digest.Digest, p peer.ID, now time.Time) peer.ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[digest.Digest]claim{}
	}
	for k, cl := range c.by {
		if !now.Before(cl.until) {
			delete(c.by, k)
		}
	}
	if cl, ok := c.by[d]; ok && cl.peer != p {
		return cl.peer
	}
	c.by[d] = claim{peer: p, until: now.Add(claimTTL)}
	return ""
}
