package implied

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/continuity/sysx"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/pullwise/pullwise/transfer/layerdir"
)

// Snapshotter is the snapshotter containerd's unpacker commits layers
// with. Committing a layer applied in parallel onto its parent, it first
// gives the directories the layer implies (Dirs) the attributes they have
// in the parent's layers; removing a snapshot that is not committed, it
// forgets them.
type Snapshotter struct {
	snapshots.Snapshotter
	Dirs *Dirs
}

// Commit implements snapshots.Snapshotter. containerd commits the layers
// of an image in order, so the parent is complete when its child commits.
func (s Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return err
		}
	}
	if info.Parent != "" {
		if err := s.inherit(ctx, key, info.Parent); err != nil {
			return fmt.Errorf("implied directories of %s from %s: %w", key, info.Parent, err)
		}
	}
	return s.Snapshotter.Commit(ctx, name, key, opts...)
}

// Remove implements snapshots.Snapshotter.
func (s Snapshotter) Remove(ctx context.Context, key string) error {
	if s.Dirs.len() == 0 {
		return s.Snapshotter.Remove(ctx, key)
	}
	if mounts, err := s.Snapshotter.Mounts(ctx, key); err == nil {
		if dir, ok := layerdir.BindSource(mounts); ok {
			s.Dirs.take(dir)
		}
	}
	return s.Snapshotter.Remove(ctx, key)
}

func (s Snapshotter) inherit(ctx context.Context, key, parent string) error {
	if s.Dirs.len() == 0 {
		// Most layers list every directory: no lookup on their commit.
		return nil
	}
	mounts, err := s.Snapshotter.Mounts(ctx, key)
	if err != nil {
		return err
	}
	upper, ok := layerdir.BindSource(mounts)
	if !ok {
		return nil
	}
	dirs := s.Dirs.take(upper)
	if len(dirs) == 0 {
		return nil
	}
	// A view is how a snapshotter tells where a committed snapshot's
	// layers are; it is removed at once.
	view := "pullwise-implied-" + rand.Text() + "-" + parent
	lowerMounts, err := s.Snapshotter.View(ctx, view, parent)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := s.Snapshotter.Remove(context.WithoutCancel(ctx), view); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("key", view).Warn("remove view of an image's layers")
		}
	}()
	lowers, err := layerDirs(lowerMounts)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if err := inheritDir(upper, d, lowers); err != nil {
			return err
		}
	}
	return nil
}

// layerDirs returns the directories of a view's layers, top first: one
// bind mount for a single layer, overlay's lowerdir for more.
func layerDirs(mounts []mount.Mount) ([]string, error) {
	if dir, ok := layerdir.BindSource(mounts); ok {
		return []string{dir}, nil
	}
	if len(mounts) == 1 && mounts[0].Type == "overlay" {
		if lower, ok := layerdir.OverlayOption(mounts[0], "lowerdir="); ok {
			return strings.Split(lower, ":"), nil
		}
	}
	return nil, fmt.Errorf("layers of a view mounted as %v: %w", mounts, errors.ErrUnsupported)
}

// inheritDir gives upper's directory rel the owner, mode and extended
// attributes rel has in the first of lowers that has it, as archive's
// mkparent does: a lower where rel is not a directory (a file, or a
// whiteout) hides the ones below, and then the directory stays 0755 and
// root's. Its times are left as the unpack made them: mkparent copies
// them too, but the entries written into the directory after that set its
// modification time to the time of the unpack. A directory reached
// through a symbolic link in the layer is left alone.
func inheritDir(upper, rel string, lowers []string) error {
	path := filepath.Join(upper, rel)
	if resolved, err := fs.RootPath(upper, rel); err != nil || resolved != path {
		return err
	}
	if fi, err := os.Lstat(path); err != nil || !fi.IsDir() {
		// The layer removed it, or made it something else, after implying it.
		return nil
	}
	for _, lower := range lowers {
		lpath, err := fs.RootPath(lower, rel)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(lpath)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		if err := os.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if err := os.Chmod(path, fi.Mode()); err != nil {
			return err
		}
		return copyXattrs(path, lpath)
	}
	return nil
}

// copyXattrs copies src's extended attributes to dst, except trusted.*
// ones (overlay's own, such as the opaque mark), as mkparent does.
func copyXattrs(dst, src string) error {
	keys, err := sysx.LListxattr(src)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, sysx.ENODATA) {
			return nil
		}
		return fmt.Errorf("list xattrs of %s: %w", src, err)
	}
	for _, k := range keys {
		if strings.HasPrefix(k, "trusted.") {
			continue
		}
		v, err := sysx.LGetxattr(src, k)
		if err != nil {
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, sysx.ENODATA) {
				continue
			}
			return fmt.Errorf("get xattr %s of %s: %w", k, src, err)
		}
		if err := unix.Lsetxattr(dst, k, v, 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				continue
			}
			return fmt.Errorf("set xattr %s on %s: %w", k, dst, err)
		}
	}
	return nil
}
