// Package contenttest gives tests a content store of containerd's own
// (plugins/content/local) in a temporary directory, with its labels kept in
// memory: local.NewStore alone is immutable and refuses the labels a pull
// sets (GC references, distribution sources), and containerd keeps them in
// its metadata database, which these tests do without.
package contenttest

import (
	"maps"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/opencontainers/go-digest"
)

// NewStore returns a content store in t's temporary directory.
func NewStore(t testing.TB) content.Store {
	t.Helper()
	cs, err := local.NewLabeledStore(t.TempDir(), &labels{m: map[digest.Digest]map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// labels implements local.LabelStore in memory.
type labels struct {
	mu sync.Mutex
	m  map[digest.Digest]map[string]string
}

func (l *labels) Get(d digest.Digest) (map[string]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.m[d]), nil
}

func (l *labels) Set(d digest.Digest, m map[string]string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[d] = maps.Clone(m)
	return nil
}

// Update sets the labels in update; an empty value removes one.
func (l *labels) Update(d digest.Digest, update map[string]string) (map[string]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.m[d]
	if m == nil {
		m = map[string]string{}
	}
	for k, v := range update {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	l.m[d] = m
	return maps.Clone(m), nil
}
