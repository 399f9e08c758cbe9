package transfer

import (
	"testing"

	"github.com/pullwise/pullwise/transfer/source"
)

// TestFromPeers: ListPulls' bytes from peers are those of every peer that
// served the pull's blobs, and none of its registries'.
func TestFromPeers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		blobs map[string]source.BlobStats
		want  int64
	}{
		{name: "nothing fetched", want: 0},
		{name: "registry only", blobs: map[string]source.BlobStats{"registry.example": {Blobs: 2, Bytes: 100}}, want: 0},
		{name: "two peers and a mirror", blobs: map[string]source.BlobStats{
			"peer/12D3KooWA": {Blobs: 1, Bytes: 40},
			"peer/12D3KooWB": {Blobs: 2, Bytes: 60},
			"mirror.example": {Blobs: 1, Bytes: 7},
		}, want: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromPeers(source.Result{Blobs: tc.blobs}); got != tc.want {
				t.Fatalf("fromPeers = %d, want %d", got, tc.want)
			}
		})
	}
}
