package pinning

import (
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/imageref"
)

// pinModel is the reference model of pin matching: a pinned_images value
// that is a reference or an image ID names the records whose names mean
// the same image (imageref.Normalize equal); a value with a digest also
// names that content; and an image is pinned under all its names, so every
// record sharing a target with a named one is pinned.
func pinModel(value string, records []images.Image) map[string]bool {
	_, isID := digest.Parse(value)
	named, err := reference.ParseDockerRef(value)
	if value == "" || (isID != nil && err != nil) {
		return map[string]bool{}
	}
	targets := map[digest.Digest]bool{}
	if c, ok := named.(reference.Canonical); ok && isID != nil {
		targets[c.Digest()] = true
	}
	for _, r := range records {
		if imageref.Normalize(r.Name) == imageref.Normalize(value) {
			targets[r.Target.Digest] = true
		}
	}
	out := map[string]bool{}
	for _, r := range records {
		if targets[r.Target.Digest] {
			out[r.Name] = true
		}
	}
	return out
}

// FuzzPinMatching compares the pin plan with pinModel for one
// pinned_images value and two records, sharing a target or not. A record
// named exactly as the config value is always pinned, as upstream CRI
// pins it.
func FuzzPinMatching(f *testing.F) {
	t1 := digest.FromString("one")
	id := digest.FromString("config")
	for _, s := range []struct {
		value, name, other string
		shared             bool
	}{
		{"pause:3.10", "docker.io/library/pause:3.10", "sha256:" + id.Encoded(), true},
		{"registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.9", false},
		{"registry.k8s.io/pause@" + t1.String(), "other:1", "x", false},
		{"registry.k8s.io/pause:3.10@" + t1.String(), "registry.k8s.io/pause@" + t1.String(), "y", true},
		{id.String(), id.String(), "pause:3.10", true}, // pinned by image ID
		{"docker.io/library/sha256:" + id.Encoded(), id.String(), "z", false},
		{"Not A Ref", "Not A Ref", "busybox", true},
		{"", "", "busybox", true},
		{"127.0.0.1:5000/pause", "127.0.0.1:5000/pause:latest", "127.0.0.1:5000/pause:v2", false},
	} {
		f.Add(s.value, s.name, s.other, s.shared)
	}
	f.Fuzz(func(t *testing.T, value, name, other string, shared bool) {
		if name == other {
			return // one record per name in a store
		}
		otherTarget := digest.FromString("two")
		if shared {
			otherTarget = t1
		}
		records := []images.Image{
			{Name: name, Target: ocispec.Descriptor{Digest: t1}},
			{Name: other, Target: ocispec.Descriptor{Digest: otherTarget}},
		}
		pins, _ := NewPins(map[string]string{"sandbox": value})
		plan := pins.plan(records)
		want := pinModel(value, records)
		for _, r := range records {
			got := len(plan[r.Name]) > 0
			if got != want[r.Name] {
				t.Fatalf("pin %q, records %q/%q (shared target %v): %q pinned = %v, model says %v",
					value, name, other, shared, r.Name, got, want[r.Name])
			}
			if got && !slices.Equal(plan[r.Name], []string{"sandbox"}) {
				t.Fatalf("%q pinned by %q", r.Name, plan[r.Name])
			}
		}
		if name == value && want[name] != (len(plan[name]) > 0) {
			t.Fatalf("record named exactly %q is not pinned", value)
		}
	})
}
