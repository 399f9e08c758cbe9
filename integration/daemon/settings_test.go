package daemon

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pullwise/pullwise/integration/registry"
)

// fatalRecorder is a testing.TB whose Fatalf records its message and
// returns, so that a test can see what a helper refuses.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

// TestNumberSettings: each numeric setting gives its default when unset,
// the number it holds, and refuses what is not a number or is below its
// least, naming itself.
func TestNumberSettings(t *testing.T) {
	settings := []struct {
		env   string
		read  func(testing.TB) int
		def   int
		least int
	}{
		{"PULLWISE_BENCH_LIMIT", Limit, 3, 0},
		{"PULLWISE_BENCH_BURST", Burst, 0, 0},
		{"PULLWISE_BENCH_PROFILE_SECONDS", profileSeconds, 2, 1},
	}
	for _, s := range settings {
		for _, tc := range []struct {
			value   string
			want    int
			refused bool
		}{
			{value: "", want: s.def},
			{value: fmt.Sprint(s.least), want: s.least},
			{value: "4", want: 4},
			{value: fmt.Sprint(s.least - 1), refused: true},
			{value: "two", refused: true},
			{value: "4 ", refused: true},
		} {
			t.Setenv(s.env, tc.value)
			rec := &fatalRecorder{TB: t}
			got := s.read(rec)
			if tc.refused {
				if !strings.Contains(rec.msg, s.env) {
					t.Errorf("%s=%q: not refused (read %d)", s.env, tc.value, got)
				}
				continue
			}
			if rec.msg != "" || got != tc.want {
				t.Errorf("%s=%q: read %d (refusal %q), want %d", s.env, tc.value, got, rec.msg, tc.want)
			}
		}
	}
}

// TestProfileWanted: the profiles asked for are wanted, every one when
// none is asked for, and a name that is not a profile is refused.
func TestProfileWanted(t *testing.T) {
	for _, tc := range []struct {
		env           string
		loopback, wan bool
		refused       bool
	}{
		{env: "", loopback: true, wan: true},
		{env: "loopback", loopback: true},
		{env: "wan", wan: true},
		{env: "wan,loopback", loopback: true, wan: true},
		{env: "lo", refused: true},
		{env: "WAN", refused: true},
		{env: "wan,", refused: true},
	} {
		t.Setenv("PULLWISE_BENCH_PROFILES", tc.env)
		for _, p := range []struct {
			name string
			want bool
		}{{"loopback", tc.loopback}, {"wan", tc.wan}} {
			rec := &fatalRecorder{TB: t}
			got := profileWanted(rec, p.name)
			if tc.refused {
				if !strings.Contains(rec.msg, "PULLWISE_BENCH_PROFILES") {
					t.Errorf("PULLWISE_BENCH_PROFILES=%q: not refused", tc.env)
				}
				continue
			}
			if rec.msg != "" || got != p.want {
				t.Errorf("PULLWISE_BENCH_PROFILES=%q: %s wanted %v (refusal %q), want %v", tc.env, p.name, got, rec.msg, p.want)
			}
		}
	}
}

// TestProfiles: the profiles asked for, in the order they run, each with
// its place among all of them, so that the WAN alone starts its runtimes
// in the order it has beside loopback.
func TestProfiles(t *testing.T) {
	loopback := Profile{Name: "loopback", Index: 0}
	wan := Profile{Name: "wan", WAN: &registry.DefaultWAN, Index: 1}
	for _, tc := range []struct {
		env  string
		want []Profile
	}{
		{"", []Profile{loopback, wan}},
		{"wan", []Profile{wan}},
		{"wan,loopback", []Profile{loopback, wan}},
		{"loopback", []Profile{loopback}},
	} {
		t.Setenv("PULLWISE_BENCH_PROFILES", tc.env)
		if got := Profiles(t); !slices.Equal(got, tc.want) {
			t.Errorf("PULLWISE_BENCH_PROFILES=%q: %v, want %v", tc.env, got, tc.want)
		}
	}
}
