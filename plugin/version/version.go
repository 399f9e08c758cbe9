// Package version says which Pullwise build this is: the Pullwise version,
// the commit it was built from, and the upstream containerd it carries.
package version

import (
	"runtime/debug"
	"strings"
)

// Version is the Pullwise version: the Makefile sets it with -ldflags -X to
// `git describe`, a tag such as v0.3.0 or, where no tag exists, the commit.
// A plain `go build` leaves it empty and Pullwise() falls back to the
// commit.
var Version = ""

// Revision is the commit, set by the Makefile like Version, with ".m" for a
// modified tree. Without it the Go toolchain's VCS stamp is used, which
// machines with GOFLAGS=-buildvcs=false (and builds outside git) lack.
var Revision = ""

// upstreamModule is the containerd module whose release this build carries.
const upstreamModule = "github.com/containerd/containerd/v2"

// Package is what `containerd --version` names as the distributor, where
// upstream's release names github.com/containerd/containerd/v2.
const Package = "github.com/pullwise/pullwise"

// build is read once: the module graph and VCS stamp do not change while the
// binary runs.
var build = func() buildInfo {
	var b buildInfo
	if bi, ok := debug.ReadBuildInfo(); ok {
		b = fromBuildInfo(bi)
	}
	if Revision != "" {
		b.commit = Revision
	}
	return b
}()

type buildInfo struct {
	upstream string // containerd module version, e.g. v2.4.2
	commit   string // full VCS revision, ".m" appended when modified
}

func fromBuildInfo(bi *debug.BuildInfo) buildInfo {
	var b buildInfo
	for _, dep := range bi.Deps {
		if dep.Path == upstreamModule {
			b.upstream = dep.Version
			// A replacement by another version is what is built; one by a
			// local directory has no version, and keeps the required one.
			if dep.Replace != nil && dep.Replace.Version != "" {
				b.upstream = dep.Replace.Version
			}
		}
	}
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	// containerd's own Makefile marks a build from a modified tree ".m".
	if b.commit != "" && modified {
		b.commit += ".m"
	}
	return b
}

// Upstream is the containerd release this build carries, read from the
// module graph so that no build step can get it wrong.
func Upstream() string {
	if build.upstream == "" {
		return "unknown"
	}
	return build.upstream
}

// Commit is the commit this build came from, as the Go toolchain stamped
// it; "unknown" when built outside a git work tree.
func Commit() string {
	if build.commit == "" {
		return "unknown"
	}
	return build.commit
}

// Pullwise is the Pullwise version: Version, or the short commit.
func Pullwise() string {
	return pullwise(Version, build.commit)
}

// Runtime is the version containerd reports, in `containerd --version` and
// CRI's RuntimeVersion: upstream's, with Pullwise's version and commit as
// semver build metadata. Kubelet parses RuntimeVersion as semver
// (kuberuntime newRuntimeVersion) for the node's containerRuntimeVersion;
// build metadata keeps it parseable and orders it as the upstream release.
func Runtime() string {
	return runtimeVersion(Upstream(), Version, build.commit)
}

func pullwise(version, commit string) string {
	switch {
	case version != "":
		return version
	case commit != "":
		return short(commit)
	}
	return "dev"
}

func runtimeVersion(upstream, version, commit string) string {
	meta := []string{"pullwise", pullwise(version, commit)}
	// git describe names the commit already unless it is exactly a tag.
	if c := short(commit); c != "" && !strings.Contains(meta[1], c) {
		meta = append(meta, c)
	}
	for i, m := range meta {
		meta[i] = identifier(m)
	}
	return upstream + "+" + strings.Join(meta, ".")
}

// short is the commit as git describe abbreviates it, with the modified
// mark kept.
func short(commit string) string {
	rev, mark, _ := strings.Cut(commit, ".")
	if len(rev) > 7 {
		rev = rev[:7]
	}
	if mark != "" {
		return rev + "." + mark
	}
	return rev
}

// identifier keeps only what semver allows in build metadata, so that no
// tag name can make RuntimeVersion unparseable.
func identifier(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '-', r == '.':
			return r
		}
		return '-'
	}, s)
}
