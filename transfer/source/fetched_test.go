package source

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestFetchWatch(t *testing.T) {
	config := ocispec.Descriptor{Digest: digest.FromString("config"), Size: 10}
	l1 := ocispec.Descriptor{Digest: digest.FromString("l1"), Size: 100}
	l2 := ocispec.Descriptor{Digest: digest.FromString("l2"), Size: 50}
	manifest, _ := json.Marshal(ocispec.Manifest{Config: config, Layers: []ocispec.Descriptor{l1, l2}})
	index, _ := json.Marshal(ocispec.Index{Manifests: []ocispec.Descriptor{{Digest: digest.FromString("m")}}})

	type step struct {
		manifest []byte
		blob     ocispec.Descriptor
		n        int64
	}
	for _, tc := range []struct {
		name    string
		present []digest.Digest
		// unpacked is how many leading layers have snapshots once the
		// config is local; -1: no OnUnpacked.
		unpacked int
		steps    []step
		done     bool
		left     int64 // layer bytes not on the node, by the image manifest; -1: none seen
	}{
		{"every blob read", nil, -1, []step{{manifest: index}, {manifest: manifest}, {blob: config, n: 10}, {blob: l1, n: 100}, {blob: l2, n: 50}}, true, 150},
		{"resumed with a range", nil, -1, []step{{manifest: manifest}, {blob: config, n: 10}, {blob: l1, n: 60}, {blob: l1, n: 40}, {blob: l2, n: 50}}, true, 150},
		{"a layer already present", []digest.Digest{l2.Digest}, -1, []step{{manifest: manifest}, {blob: config, n: 10}, {blob: l1, n: 100}}, true, 100},
		{"everything present", []digest.Digest{config.Digest, l1.Digest, l2.Digest}, -1, []step{{manifest: manifest}}, true, 0},
		{"a layer short", nil, -1, []step{{manifest: manifest}, {blob: config, n: 10}, {blob: l1, n: 99}, {blob: l2, n: 50}}, false, 150},
		{"only the index seen", nil, -1, []step{{manifest: index}, {blob: config, n: 10}}, false, -1},
		{"blobs before the manifest", nil, -1, []step{{blob: config, n: 10}, {blob: l1, n: 100}, {blob: l2, n: 50}}, false, -1},
		{"a manifest cut short", nil, -1, []step{{manifest: manifest[:len(manifest)/2]}, {blob: config, n: 10}}, false, -1},
		// discard_unpacked_layers: l1's blob is gone, its snapshot is
		// not, so containerd never fetches it.
		{"first layer's snapshot kept, config local", []digest.Digest{config.Digest}, 1, []step{{manifest: manifest}, {blob: l2, n: 50}}, true, 50},
		{"first layer's snapshot kept, config fetched", nil, 1, []step{{manifest: manifest}, {blob: config, n: 10}, {blob: l2, n: 50}}, true, 150},
		{"every snapshot kept", []digest.Digest{config.Digest}, 2, []step{{manifest: manifest}}, true, 0},
		{"no snapshot kept", []digest.Digest{config.Digest}, 0, []step{{manifest: manifest}, {blob: l2, n: 50}}, false, 150},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			rec := &Recorder{}
			rec.OnFetched(func(d digest.Digest) bool {
				for _, p := range tc.present {
					if p == d {
						return true
					}
				}
				return false
			}, func() { calls++ })
			// The config is local once it was present or read: its
			// commit follows its last byte.
			configLocal := slices.Contains(tc.present, config.Digest)
			asked := 0 // answers given once the config is local
			if tc.unpacked >= 0 {
				rec.OnUnpacked(func(c digest.Digest, layers []ocispec.Descriptor) (int, bool) {
					if c != config.Digest || len(layers) != 2 {
						t.Errorf("asked about config %s with %d layers", c, len(layers))
					}
					if !configLocal {
						return 0, false
					}
					asked++
					return tc.unpacked, true
				})
			}
			left := int64(-1)
			for _, s := range tc.steps {
				if s.manifest != nil {
					if missing, ok := rec.fetchWatch().manifestBody(s.manifest); ok {
						left = Bytes(missing)
					}
					continue
				}
				rec.blob("mirror", s.blob.Digest.String())(s.n)
				configLocal = configLocal || s.blob.Digest == config.Digest
			}
			// A late byte after completion does not report twice.
			rec.blob("mirror", config.Digest.String())(1)
			if want := map[bool]int{true: 1, false: 0}[tc.done]; calls != want {
				t.Fatalf("done called %d times, want %d", calls, want)
			}
			if left != tc.left {
				t.Fatalf("bytes left = %d, want %d", left, tc.left)
			}
			// Snapshots are asked about once per image, not at every blob.
			if asked > 1 {
				t.Fatalf("snapshots asked about %d times", asked)
			}
		})
	}
}

// A remote snapshotter mounts layers that containerd never fetches: the
// pull is done fetching once the config is in and every layer is either
// read or mounted lazily, and the blobs label counts them on the host
// that resolved the image.
func TestMountedLazily(t *testing.T) {
	config := ocispec.Descriptor{Digest: digest.FromString("config"), Size: 10}
	l1 := ocispec.Descriptor{Digest: digest.FromString("l1"), Size: 100}
	l2 := ocispec.Descriptor{Digest: digest.FromString("l2"), Size: 50}
	manifest, _ := json.Marshal(ocispec.Manifest{Config: config, Layers: []ocispec.Descriptor{l1, l2}})
	for _, tc := range []struct {
		name     string
		lazy     []ocispec.Descriptor
		readL2   bool
		wantDone bool
	}{
		{name: "every layer lazy", lazy: []ocispec.Descriptor{l1, l2}, wantDone: true},
		{name: "one lazy, one read", lazy: []ocispec.Descriptor{l1}, readL2: true, wantDone: true},
		{name: "one lazy, one still to come", lazy: []ocispec.Descriptor{l1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := 0
			rec := &Recorder{}
			rec.OnFetched(func(digest.Digest) bool { return false }, func() { done++ })
			rec.manifest("registry:5000", "app", "v1")
			rec.fetchWatch().manifestBody(manifest)
			rec.blob("registry:5000", config.Digest.String())(config.Size)
			for _, l := range tc.lazy {
				if got := rec.MountedLazily(l.Digest); got != l.Size {
					t.Fatalf("MountedLazily(%s) = %d, want the layer's size %d", l.Digest, got, l.Size)
				}
			}
			if tc.readL2 {
				rec.blob("registry:5000", l2.Digest.String())(l2.Size)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.wantDone]; done != want {
				t.Fatalf("done called %d times, want %d", done, want)
			}
			got := rec.Result("v1").Blobs["registry:5000"]
			if got.Lazy != len(tc.lazy) {
				t.Fatalf("blobs label counts %d lazy layers, want %d (%+v)", got.Lazy, len(tc.lazy), got)
			}
		})
	}
}

// TestOnBlobs: once a watched pull's image manifest is in, it names the
// blobs the pull will fetch (for the node's peers to expect): neither
// present nor under a layer whose snapshot is kept.
func TestOnBlobs(t *testing.T) {
	config := ocispec.Descriptor{Digest: digest.FromString("config"), Size: 10}
	l1 := ocispec.Descriptor{Digest: digest.FromString("l1"), Size: 100}
	l2 := ocispec.Descriptor{Digest: digest.FromString("l2"), Size: 50}
	manifest, _ := json.Marshal(ocispec.Manifest{Config: config, Layers: []ocispec.Descriptor{l1, l2}})
	index, _ := json.Marshal(ocispec.Index{Manifests: []ocispec.Descriptor{{Digest: digest.FromString("m")}}})
	for _, tc := range []struct {
		name     string
		body     []byte
		present  []digest.Digest
		unpacked int // leading layers with snapshots
		want     []digest.Digest
	}{
		{name: "nothing on the node", body: manifest, want: []digest.Digest{config.Digest, l1.Digest, l2.Digest}},
		{name: "config and a layer present", body: manifest, present: []digest.Digest{config.Digest, l2.Digest}, want: []digest.Digest{l1.Digest}},
		{name: "first layer's snapshot kept", body: manifest, present: []digest.Digest{config.Digest}, unpacked: 1, want: []digest.Digest{l2.Digest}},
		{name: "an index names no blob", body: index},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &Recorder{}
			rec.OnFetched(func(d digest.Digest) bool { return slices.Contains(tc.present, d) }, func() {})
			rec.OnUnpacked(func(digest.Digest, []ocispec.Descriptor) (int, bool) { return tc.unpacked, true })
			var got []digest.Digest
			calls := 0
			rec.OnBlobs(func(blobs []ocispec.Descriptor) {
				calls++
				for _, b := range blobs {
					if b.Size == 0 {
						t.Errorf("blob %s without its size", b.Digest)
					}
					got = append(got, b.Digest)
				}
			})
			rec.manifestBody(tc.body)
			if want := map[bool]int{true: 1, false: 0}[tc.want != nil]; calls != want || !slices.Equal(got, tc.want) {
				t.Fatalf("OnBlobs called %d times with %v, want %d with %v", calls, got, want, tc.want)
			}
		})
	}
}
