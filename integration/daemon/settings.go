package daemon

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pullwise/pullwise/integration/registry"
)

// The benchmarks' settings, PULLWISE_BENCH_* (docs/benchmarks.md,
// "Reproduce"), are read here for both benchmark packages, ./integration
// and ./integration/kubelet, so that a setting means the same in both,
// and a mistyped number fails the run rather than running a benchmark
// other than the one asked for. PULLWISE_BENCH_PROFILE and _TRACE are
// read where they are taken, in ProfileAsked.

// Limit is Pullwise's max_parallel_image_pulls in the benchmarks,
// PULLWISE_BENCH_LIMIT: 3 when unset, 0 for no limit.
func Limit(t testing.TB) int {
	t.Helper()
	return settingInt(t, "PULLWISE_BENCH_LIMIT", 3, 0, "max_parallel_image_pulls: 0 (no limit), 1, 2, ...")
}

// Burst is the number of this benchmark process in a set of runs,
// PULLWISE_BENCH_BURST (0 when unset). A process starts the daemons' turns
// (Order) there, so that a set of processes, each with its number, takes
// turns as the bursts of one process do.
func Burst(t testing.TB) int {
	t.Helper()
	return settingInt(t, "PULLWISE_BENCH_BURST", 0, 0, "the number of this process in a set of runs: 0, 1, 2, ...")
}

// profileSeconds is how long ProfileAsked profiles,
// PULLWISE_BENCH_PROFILE_SECONDS (2 when unset).
func profileSeconds(t testing.TB) int {
	t.Helper()
	return settingInt(t, "PULLWISE_BENCH_PROFILE_SECONDS", 2, 1, "a whole number of seconds, 1 or more")
}

// Profile is one of the benchmarks' network profiles.
type Profile struct {
	Name string
	// WAN is the link in front of the registry; nil on loopback.
	WAN *registry.WAN
	// Index is its place among all the profiles, whichever
	// PULLWISE_BENCH_PROFILES leaves out, so that a profile's runtimes
	// start in the same order (Order) whether it runs alone or not.
	Index int
}

// profiles are the benchmarks' network profiles, in the order they run.
// Their Index is their place here, set by Profiles.
var profiles = []Profile{{Name: "loopback"}, {Name: "wan", WAN: &registry.DefaultWAN}}

// Profiles are the network profiles PULLWISE_BENCH_PROFILES asks for, in
// the order they run (profileWanted).
func Profiles(t testing.TB) []Profile {
	t.Helper()
	var out []Profile
	for i, p := range profiles {
		if profileWanted(t, p.Name) {
			p.Index = i
			out = append(out, p)
		}
	}
	return out
}

// profileWanted says whether PULLWISE_BENCH_PROFILES (network profiles,
// comma-separated; every one when unset) asks for the profile name. It
// fails t on a name that is not a profile, which would otherwise run
// nothing and pass.
func profileWanted(t testing.TB, name string) bool {
	t.Helper()
	p := os.Getenv("PULLWISE_BENCH_PROFILES")
	if p == "" {
		return true
	}
	var names []string
	for _, pr := range profiles {
		names = append(names, pr.Name)
	}
	asked := strings.Split(p, ",")
	for _, a := range asked {
		if !slices.Contains(names, a) {
			t.Fatalf("PULLWISE_BENCH_PROFILES=%q: want %s, comma-separated", p, strings.Join(names, " or "))
		}
	}
	return slices.Contains(asked, name)
}

// Noise says whether PULLWISE_BENCH_NOISE asks for a second stock daemon
// (or node) beside the first, whose ratio to the first is how far stock
// moves against itself in a run. It is off by default, as it makes each
// burst half as long again.
func Noise() bool { return os.Getenv("PULLWISE_BENCH_NOISE") != "" }

// Transfer is PULLWISE_BENCH_TRANSFER: TOML lines for Pullwise's transfer
// plugin table.
func Transfer() string { return os.Getenv("PULLWISE_BENCH_TRANSFER") }

// StockTransfer is PULLWISE_BENCH_STOCK_TRANSFER: the same for stock's.
func StockTransfer() string { return os.Getenv("PULLWISE_BENCH_STOCK_TRANSFER") }

// Timelines is the file PULLWISE_BENCH_TIMELINES names, to which the CRI
// benchmarks append Pullwise's per-pull timelines; "" for none.
func Timelines() string { return os.Getenv("PULLWISE_BENCH_TIMELINES") }

// Verbose says whether PULLWISE_BENCH_VERBOSE asks for every pull's or
// pod's time, and where a burst's time went.
func Verbose() bool { return os.Getenv("PULLWISE_BENCH_VERBOSE") != "" }

// DebugLog says whether PULLWISE_BENCH_VERBOSE=debug asks for the daemons
// to log at debug level, whose lines the timelines include. Only when
// asked: a debug log costs CPU the figures would count.
func DebugLog() bool { return os.Getenv("PULLWISE_BENCH_VERBOSE") == "debug" }

// LogLevel is the benchmarks' containerd log level: debug when DebugLog
// asks for it, info otherwise.
func LogLevel() string {
	if DebugLog() {
		return "debug"
	}
	return "info"
}

// TimelineLine says whether a line of a daemon's log belongs in a
// benchmark's timelines: Pullwise's timeline of each pull, and at debug
// level each layer's wait for an unpack place, a large layer's early
// write (transfer/early), a pull's wait for another's lock on a blob or
// layer both images hold (transfer/lane.KeyedLock), a slow write to the
// metadata database (transfer/commits), a blob body's time on the link
// (transfer/hostclient), and containerd's own line when it commits the
// layer's snapshot (in parallel unpack, in order, once every layer before
// it is in).
func TimelineLine(line string) bool {
	for _, s := range []string{"image pull timeline", "layer unpacked in its lane", "layer written while it arrived", "waited for another pull's lock", "metadata write was slow", `msg="layer unpacked"`, "blob body read"} {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// Verbosef writes a line that PULLWISE_BENCH_VERBOSE asks for, under t's
// name, to the standard error, and nothing when it is not asked for. Not
// t.Logf: the testing package cuts a benchmark's log to its first ten
// lines, and a burst of forty images has more.
func Verbosef(t testing.TB, format string, args ...any) {
	if Verbose() {
		fmt.Fprintf(os.Stderr, "    %s: %s\n", t.Name(), fmt.Sprintf(format, args...))
	}
}

// settingInt is the whole number the environment variable name holds, def
// when unset; it fails t on anything else, or on a number below least,
// saying what is wanted.
func settingInt(t testing.TB, name string, def, least int, want string) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < least {
		t.Fatalf("%s=%q: want %s", name, s, want)
	}
	return n
}
