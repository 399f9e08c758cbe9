package main

import (
	"slices"
	"strings"
	"testing"
)

func TestNum(t *testing.T) {
	for _, tc := range []struct {
		v, goal float64
		want    string
	}{
		{0.7312, 0.6, "0.73"},
		{0.95, 0.95, "0.95"},
		{0.9512, 0.95, "0.9512"}, // a miss that two places would print as the goal
		{0.9474, 0.95, "0.9474"}, // a pass that two places would print as the goal
		{0.9500001, 0.95, "0.95"},
		{1.2, 0, "1.20"}, // no goal: two places
	} {
		if got := num(tc.v, tc.goal); got != tc.want {
			t.Errorf("num(%v, %v) = %q, want %q", tc.v, tc.goal, got, tc.want)
		}
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		vs   []float64
		goal float64
		want string
	}{
		{[]float64{0.42, 0.31, 0.55}, 0.6, "0.31-0.55"},
		{[]float64{0.42, 0.61}, 0.6, "**0.42-0.61**"},
		{[]float64{0.701, 0.699}, 0.75, "0.70"},
		{[]float64{0.9, 0.9512}, 0.95, "**0.90-0.9512**"},
	} {
		if got := spread(tc.vs, tc.goal); got != tc.want {
			t.Errorf("spread(%v, %v) = %q, want %q", tc.vs, tc.goal, got, tc.want)
		}
	}
}

// The two shapes of output: kubelet's, a sub-benchmark per daemon and
// then the ratios; CRI's, one line with the daemons' places.
const sample = `goos: linux
cpu: Some CPU
BenchmarkKubeletCorpusNodeBoot/loopback/pullwise/floor-2 	1	9177253021 ns/op
BenchmarkKubeletCorpusNodeBoot/loopback/pullwise/cold-2 	1	8775088863 ns/op
BenchmarkKubeletCorpusNodeBoot/loopback/stock/floor-2 	1	8594124205 ns/op
BenchmarkKubeletCorpusNodeBoot/loopback/stock/cold-2 	1	6919887547 ns/op
BenchmarkKubeletCorpusNodeBoot/loopback/ratios-2 	1	220950 ns/op	0.4959 first-ratio	1.258 median-ratio	0.9512 last-ratio	0.7 delay-median-ratio	5.33 pullwise-daemon-cpu-s	3.72 stock-daemon-cpu-s	276.2 pullwise-peak-rss-MiB	64.74 stock-peak-rss-MiB
--- BENCH: BenchmarkKubeletCorpusNodeBoot/loopback/ratios-2
    kubelet_test.go:1: a log line
BenchmarkCorpusUnseenGiant/wan-2 	1	7554120297 ns/op	0.35 first-ratio	0.66 median-ratio	0.64 small-median-ratio	0.84 makespan-ratio	1.76 pullwise-median-vs-bound	1.72 pullwise-makespan-vs-bound	18.1 pullwise-daemon-cpu-s	19.3 stock-daemon-cpu-s	18.4 again-daemon-cpu-s	2 stock-place	3 pullwise-place	1 again-place
BenchmarkCorpusUnseenFlood/wan-2 	1	7554120297 ns/op	8.6 pullwise-daemon-cpu-s
PASS
`

func TestReadRuns(t *testing.T) {
	runs, err := readRuns(strings.NewReader(sample), "sample")
	if err != nil {
		t.Fatal(err)
	}
	// Flood's line has no ratios (its burst failed): not a run.
	if len(runs) != 2 {
		t.Fatalf("read %d runs, want 2: %+v", len(runs), runs)
	}
	for i, want := range []struct {
		kind, scenario, profile string
		order                   []string
		first                   float64
	}{
		{"kubelet", "NodeBoot", "loopback", []string{"pullwise", "stock"}, 0.4959},
		{"CRI", "UnseenGiant", "wan", []string{"again", "stock", "pullwise"}, 0.35},
	} {
		r := runs[i]
		if r.kind != want.kind || r.scenario != want.scenario || r.profile != want.profile ||
			!slices.Equal(r.order, want.order) || r.metrics["first-ratio"] != want.first {
			t.Errorf("run %d = %s %s %s order %v first %v, want %+v", i, r.kind, r.scenario, r.profile, r.order, r.metrics["first-ratio"], want)
		}
	}
}

func TestTables(t *testing.T) {
	runs, err := readRuns(strings.NewReader(sample), "sample")
	if err != nil {
		t.Fatal(err)
	}
	var rangesOut, runsOut strings.Builder
	writeRanges(&rangesOut, runs)
	writeRuns(&runsOut, runs)
	for _, tc := range []struct{ got, want string }{
		{rangesOut.String(), `| scenario | CRI, WAN | kubelet, loopback |
| --- | --- | --- |
| node boot |  | 0.50 · **1.26** · **0.9512** |
| Giant | 0.35 · **0.64**¹ · 0.84 |  |

¹ The small images' (the sidecars') median.
`},
		{runsOut.String(), `| scenario | profile | runs | first | median | last | small median | delay median | noise first/median/last | write share | CPU, s: pullwise (stock, again) | peak RSS, MiB (stock) | order |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| node boot | loopback | 1 | 0.50 | **1.26** | **0.9512** | - | **0.70** | - / - / - | - | 5.3 (3.7) | 276 (65) | pullwise, stock |

| scenario | profile | runs | first | median | last | noise first/median/last | median / bound | makespan / bound | write share | daemon CPU, s (stock, again) | peak RSS, MiB (stock) | order |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| Giant | WAN | 1 | 0.35 | 0.66 (**0.64**) | 0.84 | - / - / - | **1.76** | **1.72** | - | 18.1 (19.3, 18.4) | - | again, stock, pullwise |
`},
	} {
		if tc.got != tc.want {
			t.Errorf("got\n%s\nwant\n%s", tc.got, tc.want)
		}
	}
}
