// Package implied makes containerd's parallel unpack give directories that
// a layer only implies what the sequential unpack gives them.
//
// A layer may hold d/f without an entry for d/, as some image builders
// write layers. Unpacking it on top of the layers below, containerd creates
// d with the mode, owner and extended attributes d has in those layers
// (archive's mkparent). Unpacked in parallel (max_concurrent_unpacks above
// 1, containerd v2.4.2), a layer is applied alone, before the layers below
// are, and d is created 0755 and owned by root: in the image it then hides
// what the layers below gave d, so a private directory can become
// world-readable. Applier records the directories each layer unpacked in
// parallel only implies; Snapshotter, when containerd commits that layer
// onto its parent, gives each the attributes it has in the parent's layers,
// as mkparent would have.
package implied

import "sync"

// Dirs holds, per snapshot directory a layer was applied to, the
// directories that layer implies, from its apply until its commit or
// removal.
type Dirs struct {
	mu sync.Mutex
	m  map[string][]string
}

// NewDirs returns an empty Dirs.
func NewDirs() *Dirs { return &Dirs{m: map[string][]string{}} }

func (d *Dirs) put(upper string, dirs []string) {
	if len(dirs) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m[upper] = dirs
}

// take returns and forgets what was recorded for upper.
func (d *Dirs) take(upper string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	dirs := d.m[upper]
	delete(d.m, upper)
	return dirs
}

// len is the number of layers applied and not yet committed or removed.
// At 0, commits and removals skip looking up their snapshot's directory.
func (d *Dirs) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.m)
}
