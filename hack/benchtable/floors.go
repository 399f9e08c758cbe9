package main

import (
	"errors"
	"fmt"
	"io"
)

// writeFloors writes, per CRI scenario and profile, the lowest Pullwise /
// stock that any order of the burst's work could reach in each run,
// beside Pullwise's own, for the first image, the median (the small
// images' where a big one is asked for first) and the makespan.
//
// A CRI burst reports each daemon's time against the burst's bound (the
// least CPU either daemon spent on the same images, on every CPU, or on
// the WAN their bytes over the link, whichever is longer), and no order
// of the same work beats the bound (but for the median's, an estimate).
// So Pullwise / stock cannot go below bound / stock's time, the inverse
// of stock-<x>-vs-bound. Where even that floor is over
// a goal, no scheduling can meet the goal in that run; where it is well
// under and Pullwise is not, the gap is Pullwise's. Kubelet's runs have
// no bound and are left out.
func writeFloors(w io.Writer, runs []run) error {
	type key struct{ scenario, profile string }
	var keys []key
	byKey := map[key][]run{}
	for _, r := range runs {
		if r.kind != "CRI" {
			continue
		}
		if _, ok := r.metrics["stock-first-vs-bound"]; !ok {
			continue // output from before the bound was reported
		}
		k := key{r.scenario, r.profile}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], r)
	}
	if len(keys) == 0 {
		return errors.New("no CRI run with stock's time against its bound")
	}
	fmt.Fprintln(w, "| scenario | profile | runs | first: floor (Pullwise) | median: floor (Pullwise) | makespan: floor (Pullwise) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	small := false
	for _, k := range keys {
		rs := byKey[k]
		// what names a measure as the benchmark does: first, median,
		// small-median, makespan.
		cell := func(what string, goal float64) string {
			var floor, pw []float64
			for _, r := range rs {
				floor = append(floor, 1/r.metrics["stock-"+what+"-vs-bound"])
				pw = append(pw, r.metrics[what+"-ratio"])
			}
			return fmt.Sprintf("%s (%s)", spread(floor, goal), spread(pw, goal))
		}
		med, sm := medianCell(rs[0], cell)
		small = small || sm
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", scenarioName(k.scenario), profileName(k.profile), len(rs),
			cell("first", firstGoal), med, cell("makespan", lastGoal))
	}
	if small {
		fmt.Fprint(w, smallFootnote)
	}
	return nil
}
