package space

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Statfs reads the usage of the filesystem holding path, as df shows it:
// Free is what an unprivileged writer may still use, so the filesystem's
// own root reserve stays out of the ledger.
func Statfs(path string) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Usage{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	var s unix.Stat_t
	if err := unix.Stat(path, &s); err != nil {
		return Usage{}, fmt.Errorf("stat %s: %w", path, err)
	}
	bs := uint64(st.Bsize)
	return Usage{Free: st.Bavail * bs, Total: st.Blocks * bs, Dev: uint64(s.Dev)}, nil
}
