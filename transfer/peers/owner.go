package peers

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/opencontainers/go-digest"
)

// Owner chooses, among ids, the one peer that fetches dgst from the
// registry while the others wait for it, by rendezvous (highest random
// weight) hashing: every node that sees the same live peers chooses the
// same owner, owners spread evenly over digests, and a peer leaving moves
// only the digests it owned. It returns "" for no ids.
func Owner(dgst digest.Digest, ids []peer.ID) peer.ID {
	var best peer.ID
	var bestW uint64
	for _, id := range ids {
		w := weight(dgst, id)
		// Equal weights (practically never) go to the smaller ID, so
		// the choice does not depend on the order of ids.
		if best == "" || w > bestW || (w == bestW && id < best) {
			best, bestW = id, w
		}
	}
	return best
}

// weight is the score of id for dgst: a hash of both, so every pair
// scores independently of the others.
func weight(dgst digest.Digest, id peer.ID) uint64 {
	h := sha256.New()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(dgst))
	return binary.BigEndian.Uint64(h.Sum(nil))
}
