package peers

import (
	"crypto/ed25519"
	"fmt"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/opencontainers/go-digest"
)

// testIDs returns n fixed peer IDs.
func testIDs(t *testing.T, n int) []peer.ID {
	t.Helper()
	var ids []peer.ID
	for i := range n {
		seed := make([]byte, ed25519.SeedSize)
		seed[0] = byte(i + 1)
		k, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(seed))
		if err != nil {
			t.Fatal(err)
		}
		id, err := peer.IDFromPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestOwner(t *testing.T) {
	ids := testIDs(t, 4)
	d := digest.FromString("layer")
	reversed := slices.Clone(ids)
	slices.Reverse(reversed)
	for _, tc := range []struct {
		name string
		ids  []peer.ID
		want peer.ID
	}{
		{"no peers", nil, ""},
		{"one peer", ids[2:3], ids[2]},
		{"the same whatever the order", reversed, Owner(d, ids)},
		{"the same with duplicates", append(slices.Clone(ids), ids...), Owner(d, ids)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Owner(d, tc.ids); got != tc.want {
				t.Fatalf("owner %s, want %s", got, tc.want)
			}
		})
	}
}

// TestOwnerSpreadsAndMovesLittle: each of 4 peers owns about a quarter
// of the digests, and a peer leaving moves only the digests it owned.
func TestOwnerSpreadsAndMovesLittle(t *testing.T) {
	ids := testIDs(t, 4)
	const digests = 4000
	owned := map[peer.ID]int{}
	for i := range digests {
		d := digest.FromString(fmt.Sprint(i))
		o := Owner(d, ids)
		owned[o]++
		rest := slices.DeleteFunc(slices.Clone(ids), func(id peer.ID) bool { return id == ids[0] })
		if o != ids[0] && Owner(d, rest) != o {
			t.Fatalf("%s moved from %s when another peer left", d, o)
		}
	}
	for _, id := range ids {
		if share := float64(owned[id]) / digests; share < 0.2 || share > 0.3 {
			t.Errorf("%s owns %.2f of the digests, want about 0.25", id, share)
		}
	}
}
