#!/usr/bin/env bash
# A/B two Pullwise builds on a benchmark, as issue 39 asks before a
# scheduling mechanism is kept: the builds alternate, one burst each, each
# burst on a fresh disk (hack/benchdisk.sh) against stock in the same run,
# stock and the build taking turns to go first from one burst to the next
# (PULLWISE_BENCH_BURST), and benchstat compares the arms metric by metric.
#
#   hack/ab.sh OLD NEW [BENCH [PKG]]
#
# OLD and NEW are each a directory of binaries (as `make build BIN=DIR`
# fills it) or a git revision, built here in a worktree of its own. BENCH
# is the -bench pattern (default CorpusUnseenCompressions), PKG the package
# (default ./integration/; ./integration/kubelet/ for pod starts). RUNS
# bursts per arm (default 5), OUT keeps the logs (default a new temporary
# directory). PULLWISE_BENCH_* (LIMIT, PROFILES, ...) pass through, but
# for PULLWISE_BENCH_BURST, which ab.sh sets to each burst's number, the
# same in both arms (so give the arms' profiles prefixes of their own).
#
# Why benchstat: a burst on a small node varies more than most mechanisms
# change it (stock's own image times move 2-3x between runs), so two
# arms' ranges overlap and a look at them says little. benchstat's
# Mann-Whitney U test says for each metric whether the arms differ beyond
# what these runs show of the noise ("~" where they do not). Four runs
# per arm are the fewest with which it can say they do at p < 0.05;
# issue 39 asks for five.
set -euo pipefail
if [ $# -lt 2 ]; then
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
old=$1 new=$2 bench=${3:-CorpusUnseenCompressions} pkg=${4:-./integration/}
runs=${RUNS:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/pullwise-ab-XXXXXX")}
mkdir -p "$out"
# benchstat at the version of golang.org/x/perf that go.mod requires
# (hack/benchtable reads go test's output with it), so that the project
# holds one; go run fetches it once.
benchstat=golang.org/x/perf/cmd/benchstat@$(go list -m -f '{{.Version}}' golang.org/x/perf)

# bins NAME SPEC prints the directory of SPEC's binaries, building a
# revision in a worktree of its own. Stock containerd and kubelet come
# from this checkout's bin/: they are the same in both arms.
bins() {
	local name=$1 spec=$2 dir
	if [ -d "$spec" ]; then
		dir=$(cd "$spec" && pwd)
	else
		dir=$out/bin-$name
		local tree=$out/tree-$name
		git worktree add -q --detach "$tree" "$spec"
		make -s -C "$tree" build BIN="$dir" >&2
		git worktree remove --force "$tree"
	fi
	for b in containerd-stock kubelet; do
		if [ ! -e "$dir/$b" ] && [ -e bin/$b ]; then cp bin/$b "$dir/"; fi
	done
	if [ ! -e "$dir/containerd-stock" ]; then
		echo "ab: $dir has no containerd-stock: run 'make containerd-stock' here first" >&2
		exit 1
	fi
	echo "$dir"
}
oldbin=$(bins old "$old")
newbin=$(bins new "$new")

: >"$out/old.txt"
: >"$out/new.txt"
for i in $(seq 1 "$runs"); do
	for arm in old new; do
		bin=$oldbin
		[ $arm = new ] && bin=$newbin
		log=$out/$arm-$i.log
		echo "ab: $arm, burst $i of $runs ($(date +%T))" >&2
		# Burst i - 1 of a set: the runtimes take turns going first from
		# one burst to the next (daemon.Burst), the same turn in both arms.
		hack/benchdisk.sh env PULLWISE_BIN="$bin" PULLWISE_BENCH_BURST=$((i - 1)) go test -count=1 -run '^$' -bench "$bench" -benchtime 1x -timeout 40m "$pkg" >"$log" 2>&1 || {
			echo "ab: the $arm burst failed; its log is $log" >&2
			exit 1
		}
		grep '^Benchmark' "$log" >>"$out/$arm.txt"
	done
done
go run "$benchstat" "$out/old.txt" "$out/new.txt" >"$out/benchstat.txt"
# The ratios to stock here; every metric (times, CPU, RSS, the bound) in
# the file.
go run "$benchstat" -filter '.unit:/-ratio$/' "$out/old.txt" "$out/new.txt"
echo "ab: logs and every metric's comparison (benchstat.txt) in $out" >&2
