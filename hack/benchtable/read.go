package main

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// A run is one scenario on one network profile, one line of go test's
// output with the ratios: a CRI corpus benchmark's line, or the "ratios"
// line of a kubelet one.
type run struct {
	kind     string // "CRI" or "kubelet"
	scenario string // as the benchmark names it: NodeBoot, UnseenFlood...
	profile  string // loopback or wan
	metrics  map[string]float64
	order    []string // the daemons in the order they ran, when the output says
}

// The daemons a corpus benchmark runs: stock, Pullwise, and with
// PULLWISE_BENCH_NOISE a second stock ("again") that measures the noise.
var daemons = []string{"stock", "pullwise", "again"}

// readRuns reads the runs in r, in the order they appear.
//
// A kubelet benchmark's order is the order of its daemons' sub-benchmarks
// ahead of its ratios line; a CRI benchmark's, its <daemon>-place metrics.
func readRuns(r io.Reader, name string) ([]run, error) {
	var runs []run
	ran := map[string][]string{} // kubelet scenario/profile: the daemons so far
	br := benchfmt.NewReader(r, name)
	for br.Scan() {
		res, ok := br.Result().(*benchfmt.Result)
		if !ok {
			continue // a Benchmark line benchfmt cannot read, as a failed benchmark's
		}
		base, parts := res.Name.Parts()
		if len(parts) > 0 && parts[len(parts)-1][0] == '-' {
			parts = parts[:len(parts)-1] // GOMAXPROCS
		}
		sub := make([]string, len(parts))
		for i, p := range parts {
			sub[i] = string(bytes.TrimPrefix(p, []byte("/")))
		}
		var rn run
		switch b := string(base); {
		case strings.HasPrefix(b, "KubeletCorpus") && len(sub) == 3 && sub[2] == "cold":
			key := b + "/" + sub[0]
			ran[key] = append(ran[key], sub[1])
			continue
		case strings.HasPrefix(b, "KubeletCorpus") && len(sub) == 2 && sub[1] == "ratios":
			key := b + "/" + sub[0]
			rn = run{kind: "kubelet", scenario: strings.TrimPrefix(b, "KubeletCorpus"), profile: sub[0], order: ran[key]}
			delete(ran, key)
		case strings.HasPrefix(b, "Corpus") && len(sub) == 1:
			rn = run{kind: "CRI", scenario: strings.TrimPrefix(b, "Corpus"), profile: sub[0]}
		default:
			continue
		}
		rn.metrics = map[string]float64{}
		for _, v := range res.Values {
			unit, value := v.Unit, v.Value
			if v.OrigUnit != "" {
				unit, value = v.OrigUnit, v.OrigValue
			}
			rn.metrics[unit] = value
		}
		if _, ok := rn.metrics["first-ratio"]; !ok {
			continue // a burst that failed reports no ratios
		}
		if rn.order == nil {
			rn.order = placed(rn.metrics)
		}
		runs = append(runs, rn)
	}
	if err := br.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return runs, nil
}

// placed is the daemons in the order of their -place metrics (1 first),
// or nil when the run has none: output from before they were reported.
func placed(m map[string]float64) []string {
	var order []string
	for _, d := range daemons {
		if _, ok := m[d+"-place"]; ok {
			order = append(order, d)
		}
	}
	if order == nil {
		return nil
	}
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(m[a+"-place"], m[b+"-place"]) })
	return order
}
