package imageref

import (
	"strings"
	"testing"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// FuzzNormalize checks the properties every user of Normalize relies on:
// it is idempotent, its result is a reference in full form that parses back
// to itself, and it agrees with reference.ParseDockerRef, which the places
// that need a parse error (policy, pull source, progress) call directly.
func FuzzNormalize(f *testing.F) {
	id := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, s := range []string{
		"busybox", "docker.io/busybox:1.36", "127.0.0.1:5000/team/app", "localhost/app:v1",
		"127.0.0.1:5000/app:v1@" + id, "app@" + id, id, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"", "UPPER/case", "a@sha256:zz", "::", "app:", "/app", "app\x00", "[::1]:5000/app:v1", "docker.io/library/sha256:abc",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := Normalize(s)
		if again := Normalize(n); again != n {
			t.Fatalf("not idempotent: %q -> %q -> %q", s, n, again)
		}
		if _, err := digest.Parse(s); err == nil {
			if n != s {
				t.Fatalf("image ID %q normalized to %q", s, n)
			}
			return
		}
		named, err := reference.ParseDockerRef(s)
		if err != nil {
			if n != s {
				t.Fatalf("non-reference %q changed to %q", s, n)
			}
			return
		}
		if n != named.String() {
			t.Fatalf("Normalize(%q) = %q, ParseDockerRef says %q", s, n, named.String())
		}
		// The full form is what records are named: it must survive a second
		// parse unchanged, and its familiar (short) spelling must lead back.
		back, err := reference.ParseDockerRef(n)
		if err != nil || back.String() != n {
			t.Fatalf("normalized %q (from %q) does not parse back: %v %v", n, s, back, err)
		}
		// Except where the familiar spelling is ambiguous: distribution's
		// FamiliarString drops "docker.io/" even when the repository's first
		// part looks like a host (docker.io/l.0/app becomes l.0/app, a
		// registry named l.0), so it cannot lead back there.
		fam := reference.FamiliarString(named)
		first, _, _ := strings.Cut(fam, "/")
		ambiguous := reference.Domain(named) == "docker.io" && strings.Contains(fam, "/") &&
			(strings.ContainsAny(first, ".:") || first == "localhost")
		if !ambiguous && Normalize(fam) != n {
			t.Fatalf("familiar %q of %q normalizes to %q, want %q", fam, s, Normalize(fam), n)
		}
	})
}
