package source

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/errdefs"
	distref "github.com/distribution/reference"
)

// FuzzHostDirs feeds config_path lists (CRI's "a:b" form, with empty and
// odd entries) and registry hosts to the hosts.toml lookup. The answer must
// be a directory that exists, directly in one of the listed roots, named for
// the host (host_port_, host) or _default, from the first root that has any
// of them; and a host the reference grammar allows never escapes its root.
func FuzzHostDirs(f *testing.F) {
	base := f.TempDir()
	for _, d := range []string{"a/reg.example_5000_", "a/reg.example", "b/_default", "b/other.example", "c"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for _, s := range [][2]string{
		{"a:b", "reg.example:5000"}, {"c:b", "reg.example"}, {"::a", "other.example"}, {"c:missing:b", "x.example"},
		{"a", "docker.io"}, {"", "reg.example"}, {"../..", "etc"}, {"b", "../a/reg.example"}, {"a:b", "[::1]:5000"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, list, host string) {
		// Roots are under base, so the fuzzer's names cannot reach the
		// machine's own directories.
		var roots []string
		for _, r := range filepath.SplitList(list) {
			if r != "" {
				roots = append(roots, filepath.Join(base, r))
			}
		}
		dir, err := hostDirFunc([]string{strings.Join(roots, string(filepath.ListSeparator))})(host)
		if err != nil {
			if !errors.Is(err, errdefs.ErrNotFound) {
				// Stat errors other than not-exist (a name too long, say)
				// are passed on; the pull reports them.
				return
			}
			return
		}
		if _, serr := os.Stat(dir); serr != nil {
			t.Fatalf("roots %q host %q: %q does not exist: %v", roots, host, dir, serr)
		}
		first := -1
		for i, r := range roots {
			if filepath.Dir(dir) == filepath.Clean(r) || (filepath.Clean(r) == dir && host == "") {
				first = i
				break
			}
		}
		if distref.DomainRegexp.MatchString(host) && distref.DomainRegexp.FindString(host) == host {
			if first < 0 {
				t.Fatalf("roots %q host %q: %q is in none of the roots", roots, host, dir)
			}
			if b := filepath.Base(dir); b != "_default" && b != host && !strings.HasPrefix(b, strings.Split(host, ":")[0]) {
				t.Fatalf("roots %q host %q: %q is not the host's", roots, host, dir)
			}
			for _, r := range roots[:first] {
				if d, err := config.HostDirFromRoot(r)(host); err == nil {
					t.Fatalf("roots %q host %q: %q chosen over %q of an earlier root", roots, host, dir, d)
				}
			}
		}
	})
}
