package builtins

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const (
	upstream = "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	ours     = "github.com/pullwise/pullwise/cmd/containerd/builtins"
)

// The plugin packages this build swaps out, and what it adds.
var (
	replaced = []string{
		"github.com/containerd/containerd/v2/plugins/server/grpc",
		"github.com/containerd/containerd/v2/plugins/transfer",
	}
	added = []string{
		"github.com/pullwise/pullwise/plugin/pinning",
		"github.com/pullwise/pullwise/plugin/pullwise",
		"github.com/pullwise/pullwise/plugin/server",
		"github.com/pullwise/pullwise/plugin/sweep",
		"github.com/pullwise/pullwise/plugin/transfer",
	}
)

// imports asks the go command, so build constraints (GOOS, cgo, no_* tags)
// apply to both lists alike.
func imports(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, pkg).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %s: %v\n%s", pkg, err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestSameBuiltinsAsUpstream keeps a containerd bump from silently dropping
// or adding a plugin: the lists may differ only by the replaced packages.
func TestSameBuiltinsAsUpstream(t *testing.T) {
	want := slices.DeleteFunc(imports(t, upstream), func(p string) bool { return slices.Contains(replaced, p) })
	want = append(want, added...)
	slices.Sort(want)
	got := imports(t, ours)
	slices.Sort(got)

	for _, p := range want {
		if !slices.Contains(got, p) {
			t.Errorf("missing builtin %s", p)
		}
	}
	for _, p := range got {
		if !slices.Contains(want, p) {
			t.Errorf("builtin %s is not upstream's and not a known Pullwise addition", p)
		}
	}
	for _, p := range replaced {
		if slices.Contains(got, p) {
			t.Errorf("replaced package %s is still imported: its plugins would clash with ours", p)
		}
	}
}
