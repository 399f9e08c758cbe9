package pinning

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

func TestNewPinsNormalizes(t *testing.T) {
	pauseDigest := digest.FromString("pause")
	for _, tc := range []struct {
		name       string
		config     map[string]string
		wantByName map[string][]string
		wantDigest map[digest.Digest][]string
		wantErr    []string // substrings of the error; none means no error
	}{
		{
			name:       "docker hub short name",
			config:     map[string]string{"sandbox": "pause:3.10"},
			wantByName: map[string][]string{"docker.io/library/pause:3.10": {"sandbox"}},
		},
		{
			name:       "docker hub user repository",
			config:     map[string]string{"sandbox": "someone/pause:3.10"},
			wantByName: map[string][]string{"docker.io/someone/pause:3.10": {"sandbox"}},
		},
		{
			name:       "no tag means latest",
			config:     map[string]string{"sandbox": "registry.k8s.io/pause"},
			wantByName: map[string][]string{"registry.k8s.io/pause:latest": {"sandbox"}},
		},
		{
			name:       "registry with port is not a tag",
			config:     map[string]string{"sandbox": "127.0.0.1:5000/pause"},
			wantByName: map[string][]string{"127.0.0.1:5000/pause:latest": {"sandbox"}},
		},
		{
			name:       "full name unchanged",
			config:     map[string]string{"sandbox": "registry.k8s.io/pause:3.10.2"},
			wantByName: map[string][]string{"registry.k8s.io/pause:3.10.2": {"sandbox"}},
		},
		{
			name:       "digest, tag dropped",
			config:     map[string]string{"sandbox": "registry.k8s.io/pause:3.10@" + pauseDigest.String()},
			wantByName: map[string][]string{"registry.k8s.io/pause@" + pauseDigest.String(): {"sandbox"}},
			wantDigest: map[digest.Digest][]string{pauseDigest: {"sandbox"}},
		},
		{
			name:       "two keys, one image",
			config:     map[string]string{"sandbox": "pause:3.10", "base": "docker.io/library/pause:3.10"},
			wantByName: map[string][]string{"docker.io/library/pause:3.10": {"base", "sandbox"}},
		},
		{
			name:   "empty value names nothing",
			config: map[string]string{"sandbox": ""},
		},
		{
			name:       "invalid value left out, others kept",
			config:     map[string]string{"sandbox": "pause:3.10", "broken": "Not A Reference"},
			wantByName: map[string][]string{"docker.io/library/pause:3.10": {"sandbox"}},
			wantErr:    []string{"pinned_images.broken", `"Not A Reference"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPins(tc.config)
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			for _, s := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Fatalf("error %v does not mention %q", err, s)
				}
			}
			if !maps.EqualFunc(p.byName, orEmpty(tc.wantByName), slices.Equal[[]string]) {
				t.Errorf("byName = %v, want %v", p.byName, tc.wantByName)
			}
			if !maps.EqualFunc(p.byDigest, orEmpty(tc.wantDigest), slices.Equal[[]string]) {
				t.Errorf("byDigest = %v, want %v", p.byDigest, tc.wantDigest)
			}
		})
	}
}

func orEmpty[K comparable](m map[K][]string) map[K][]string {
	if m == nil {
		return map[K][]string{}
	}
	return m
}

func TestPinnedImagesFromCRIConfig(t *testing.T) {
	// Shaped like containerd's internal CRI ImageConfig, JSON tags included.
	type criImageConfig struct {
		Snapshotter  string            `json:"snapshotter"`
		PinnedImages map[string]string `json:"pinned_images"`
	}
	got, err := PinnedImagesFromCRIConfig(&criImageConfig{
		Snapshotter:  "overlayfs",
		PinnedImages: map[string]string{"sandbox": "registry.k8s.io/pause:3.10.2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"sandbox": "registry.k8s.io/pause:3.10.2"}; !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	if _, err := PinnedImagesFromCRIConfig(func() {}); err == nil {
		t.Fatal("a config that cannot be encoded gave no error")
	}
}
