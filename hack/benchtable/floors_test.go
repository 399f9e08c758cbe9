package main

import (
	"strings"
	"testing"
)

func TestFloors(t *testing.T) {
	for _, tc := range []struct {
		name, in, want, err string
	}{{
		name: "a scenario with a big image, over two runs",
		in: `BenchmarkCorpusUnseenGiant/wan-2 	1	1 ns/op	0.35 first-ratio	0.66 median-ratio	0.64 small-median-ratio	0.84 makespan-ratio	4 stock-first-vs-bound	2 stock-median-vs-bound	2.5 stock-small-median-vs-bound	1.25 stock-makespan-vs-bound
BenchmarkCorpusUnseenGiant/wan-2 	1	1 ns/op	0.30 first-ratio	0.50 median-ratio	0.45 small-median-ratio	0.97 makespan-ratio	5 stock-first-vs-bound	1.8 stock-median-vs-bound	1.5 stock-small-median-vs-bound	1 stock-makespan-vs-bound
`,
		// The small images' median floor of 0.67 is over its goal of
		// 0.5: no order meets it in that run.
		want: `| scenario | profile | runs | first: floor (Pullwise) | median: floor (Pullwise) | makespan: floor (Pullwise) |
| --- | --- | --- | --- | --- | --- |
| Giant | WAN | 2 | 0.20-0.25 (0.30-0.35) | **0.40-0.67** (**0.45-0.64**)¹ | **0.80-1.00** (**0.84-0.97**) |

¹ The small images' (the sidecars') median.
`,
	}, {
		name: "kubelet's runs and runs without the bound are left out",
		in: sample + `BenchmarkCorpusUnseenDeep/loopback-2 	1	1 ns/op	0.5 first-ratio	0.7 median-ratio	0.9 makespan-ratio
BenchmarkCorpusUnseenFlood/loopback-2 	1	1 ns/op	0.05 first-ratio	0.36 median-ratio	0.98 makespan-ratio	100 stock-first-vs-bound	5 stock-median-vs-bound	1.5 stock-makespan-vs-bound
`,
		want: `| scenario | profile | runs | first: floor (Pullwise) | median: floor (Pullwise) | makespan: floor (Pullwise) |
| --- | --- | --- | --- | --- | --- |
| Flood | loopback | 1 | 0.01 (0.05) | 0.20 (0.36) | 0.67 (**0.98**) |
`,
	}, {
		name: "nothing to make a floor of",
		in:   sample,
		err:  "no CRI run with stock's time against its bound",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			runs, err := readRuns(strings.NewReader(tc.in), "in")
			if err != nil {
				t.Fatal(err)
			}
			var got strings.Builder
			err = writeFloors(&got, runs)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got.String(), tc.want)
			}
		})
	}
}
