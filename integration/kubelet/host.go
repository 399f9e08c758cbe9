package kubelet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Kubelet changes the host beyond its root dir. These are what kubelet
// v1.37 touches with the configuration Start writes; the harness records
// them before kubelet starts and puts them back after it stopped.

// kernelTunables are the sysctls kubelet's container manager sets when
// protectKernelDefaults is false (setupKernelTunables in
// pkg/kubelet/cm/container_manager_linux.go).
var kernelTunables = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// hardCodedDirs are written by kubelet whatever its --root-dir: the device
// plugin socket directory and the container log symlinks.
var hardCodedDirs = []string{
	"/var/lib/kubelet/device-plugins",
	"/var/log/containers",
}

// qosCgroup is the cgroup kubelet (cgroupDriver cgroupfs, cgroupsPerQOS)
// creates in every cgroup v1 hierarchy, with its QoS classes and pod
// cgroups below. kubelet never removes it.
const qosCgroup = "kubepods"

// hostState is what the host looked like before kubelet started.
type hostState struct {
	// cgroups are kubepods directories absent before kubelet started.
	cgroups []string
	sysctls map[string]string
	// created are the first missing ancestors of hardCodedDirs, which are
	// removed whole afterwards; for directories that existed, existing
	// lists their entries so only what kubelet added is removed.
	created  []string
	existing map[string]map[string]bool
}

func saveHost() (*hostState, error) {
	h := &hostState{sysctls: map[string]string{}, existing: map[string]map[string]bool{}}
	for _, name := range kernelTunables {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err != nil {
			return nil, fmt.Errorf("save sysctl %s: %w", name, err)
		}
		h.sysctls[name] = strings.TrimSpace(string(b))
	}
	hierarchies, err := filepath.Glob("/sys/fs/cgroup/*")
	if err != nil {
		return nil, err
	}
	for _, hier := range hierarchies {
		p := filepath.Join(hier, qosCgroup)
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			h.cgroups = append(h.cgroups, p)
		}
	}
	for _, dir := range hardCodedDirs {
		entries, err := os.ReadDir(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			h.created = append(h.created, firstMissing(dir))
		case err != nil:
			return nil, fmt.Errorf("save %s: %w", dir, err)
		default:
			names := map[string]bool{}
			for _, e := range entries {
				names[e.Name()] = true
			}
			h.existing[dir] = names
		}
	}
	return h, nil
}

// firstMissing is the topmost ancestor of dir (or dir) that does not exist.
func firstMissing(dir string) string {
	for {
		parent := filepath.Dir(dir)
		if _, err := os.Stat(parent); err == nil || parent == dir {
			return dir
		}
		dir = parent
	}
}

// restore puts sysctls back and removes what kubelet created in the
// hard-coded directories.
func (h *hostState) restore(t testing.TB) {
	for name, v := range h.sysctls {
		p := filepath.Join("/proc/sys", name)
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == v {
			continue
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Errorf("restore sysctl %s=%s: %v", name, v, err)
		}
	}
	for _, cg := range h.cgroups {
		removeCgroup(t, cg)
	}
	for _, dir := range h.created {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	}
	for dir, keep := range h.existing {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !keep[e.Name()] {
				if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
					t.Errorf("remove %s: %v", e.Name(), err)
				}
			}
		}
	}
}

// removeCgroup removes a cgroup v1 directory tree, deepest first; cgroup
// directories go with rmdir only, once no process is left in them.
func removeCgroup(t testing.TB, dir string) {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("walk %s: %v", dir, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("remove cgroup %s: %v", dirs[i], err)
		}
	}
}
