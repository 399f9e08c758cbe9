package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// names are the scenarios as the docs call them; a scenario not here is
// printed as the benchmark names it.
var names = map[string]string{
	"NodeBoot":           "node boot",
	"DeployBurst":        "deploy burst",
	"BigAndSmall":        "the big and the small",
	"UnseenGiant":        "Giant",
	"UnseenFlood":        "Flood",
	"UnseenDeep":         "Deep",
	"UnseenCompressions": "Compressions",
}

func scenarioName(s string) string {
	if n, ok := names[s]; ok {
		return n
	}
	return s
}

func profileName(p string) string {
	if p == "wan" {
		return "WAN"
	}
	return p
}

// num prints a ratio to two places, or to four where two would print
// the goal for a value that is not the goal: 0.9512 misses 0.95 and
// 0.9474 meets it, and neither may read as the other.
func num(v, goal float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	if goal > 0 && v != goal && s == strconv.FormatFloat(goal, 'f', 2, 64) {
		s = strings.TrimRight(strconv.FormatFloat(v, 'f', 4, 64), "0")
	}
	return s
}

// cell prints metric k of r, bold over goal (0: no goal), or "-" when
// the run has no such metric.
func cell(r run, k string, goal float64) string {
	v, ok := r.metrics[k]
	if !ok {
		return "-"
	}
	s := num(v, goal)
	if goal > 0 && v > goal {
		return "**" + s + "**"
	}
	return s
}

// spread prints the range of vs, bold when any is over goal.
func spread(vs []float64, goal float64) string {
	lo, hi := slices.Min(vs), slices.Max(vs)
	s := num(lo, goal)
	if h := num(hi, goal); h != s {
		s += "-" + h
	}
	if hi > goal {
		return "**" + s + "**"
	}
	return s
}

// medianCell is the median cell of a run's scenario, made by cell from
// the measure as the benchmarks name it and its goal: the small images'
// median where a big one is asked for first, marked ¹ (small reports it,
// for smallFootnote under the table), else the whole burst's.
func medianCell(r run, cell func(what string, goal float64) string) (s string, small bool) {
	if _, ok := r.metrics["small-median-ratio"]; ok {
		return cell("small-median", smallMedianGoal) + "¹", true
	}
	return cell("median", medianGoal), false
}

const smallFootnote = "\n¹ The small images' (the sidecars') median.\n"

// lastMetric is what a kind calls its last: the last pod under kubelet,
// the burst's makespan under CRI.
func lastMetric(kind string) string {
	if kind == "kubelet" {
		return "last-ratio"
	}
	return "makespan-ratio"
}

// A column of the ranges table: one kind of run on one profile.
type column struct{ kind, profile string }

// writeRanges writes, per scenario, first · median · last over every run
// of each kind and profile: the shape of docs/benchmarks.md's headline.
// A scenario with a big image gives its small images' median instead,
// marked ¹.
func writeRanges(w io.Writer, runs []run) {
	type cellKey struct {
		scenario string
		column
	}
	var scenarios []string
	var columns []column
	byCell := map[cellKey][]run{}
	for _, r := range runs {
		if !slices.Contains(scenarios, r.scenario) {
			scenarios = append(scenarios, r.scenario)
		}
		c := column{r.kind, r.profile}
		if !slices.Contains(columns, c) {
			columns = append(columns, c)
		}
		key := cellKey{r.scenario, c}
		byCell[key] = append(byCell[key], r)
	}
	// CRI before kubelet, loopback before the WAN, whatever the input's order.
	slices.SortStableFunc(columns, func(a, b column) int {
		return strings.Compare(a.kind, b.kind)*2 + strings.Compare(a.profile, b.profile)
	})
	most := 0
	for _, rs := range byCell {
		most = max(most, len(rs))
	}

	fmt.Fprint(w, "| scenario |")
	for _, c := range columns {
		fmt.Fprintf(w, " %s, %s |", c.kind, profileName(c.profile))
	}
	fmt.Fprint(w, "\n| --- |"+strings.Repeat(" --- |", len(columns))+"\n")
	small := false
	for _, s := range scenarios {
		fmt.Fprintf(w, "| %s |", scenarioName(s))
		for _, c := range columns {
			rs := byCell[cellKey{s, c}]
			if len(rs) == 0 {
				fmt.Fprint(w, "  |")
				continue
			}
			of := func(k string) []float64 {
				var vs []float64
				for _, r := range rs {
					vs = append(vs, r.metrics[k])
				}
				return vs
			}
			med, sm := medianCell(rs[0], func(what string, goal float64) string { return spread(of(what+"-ratio"), goal) })
			small = small || sm
			fmt.Fprintf(w, " %s · %s · %s", spread(of("first-ratio"), firstGoal), med, spread(of(lastMetric(c.kind)), lastGoal))
			if len(rs) != most {
				fmt.Fprintf(w, " (%d)", len(rs))
			}
			fmt.Fprint(w, " |")
		}
		fmt.Fprintln(w)
	}
	if small {
		fmt.Fprint(w, smallFootnote)
	}
}

// writeRuns writes a row per run, as the history's tables do: the
// kubelet runs' table, then the CRI runs'.
func writeRuns(w io.Writer, runs []run) {
	var kubelet, cri []run
	for _, r := range runs {
		if r.kind == "kubelet" {
			kubelet = append(kubelet, r)
		} else {
			cri = append(cri, r)
		}
	}
	if len(kubelet) > 0 {
		fmt.Fprintln(w, "| scenario | profile | runs | first | median | last | small median | delay median | noise first/median/last | write share | CPU, s: pullwise (stock, again) | peak RSS, MiB (stock) | order |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, r := range kubelet {
			fmt.Fprintf(w, "| %s | %s | 1 | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				scenarioName(r.scenario), profileName(r.profile),
				cell(r, "first-ratio", firstGoal), cell(r, "median-ratio", medianGoal), cell(r, "last-ratio", lastGoal),
				cell(r, "small-median-ratio", smallMedianGoal), cell(r, "delay-median-ratio", delayMedianGoal),
				noise(r), cell(r, "pullwise-write-share", 0), cpu(r), rss(r), strings.Join(r.order, ", "))
		}
	}
	if len(cri) > 0 {
		if len(kubelet) > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "| scenario | profile | runs | first | median | last | noise first/median/last | median / bound | makespan / bound | write share | daemon CPU, s (stock, again) | peak RSS, MiB (stock) | order |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, r := range cri {
			med := cell(r, "median-ratio", medianGoal)
			if _, ok := r.metrics["small-median-ratio"]; ok {
				med += " (" + cell(r, "small-median-ratio", smallMedianGoal) + ")"
			}
			order := strings.Join(r.order, ", ")
			if order == "" {
				order = "-"
			}
			fmt.Fprintf(w, "| %s | %s | 1 | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				scenarioName(r.scenario), profileName(r.profile),
				cell(r, "first-ratio", firstGoal), med, cell(r, "makespan-ratio", lastGoal),
				noise(r), cell(r, "pullwise-median-vs-bound", medianBoundGoal),
				cell(r, "pullwise-makespan-vs-bound", makespanBoundGoal(r.profile)),
				cell(r, "pullwise-write-share", 0), cpu(r), rss(r), order)
		}
	}
}

// noise is the second stock daemon against the first: how far apart the
// same daemon lands, run twice.
func noise(r run) string {
	return fmt.Sprintf("%s / %s / %s", cell(r, "first-noise-ratio", 0), cell(r, "median-noise-ratio", 0),
		cell(r, strings.TrimSuffix(lastMetric(r.kind), "-ratio")+"-noise-ratio", 0))
}

func cpu(r run) string {
	if _, ok := r.metrics["pullwise-daemon-cpu-s"]; !ok {
		return "-"
	}
	s := fmt.Sprintf("%.1f (%.1f", r.metrics["pullwise-daemon-cpu-s"], r.metrics["stock-daemon-cpu-s"])
	if v, ok := r.metrics["again-daemon-cpu-s"]; ok {
		s += fmt.Sprintf(", %.1f", v)
	}
	return s + ")"
}

func rss(r run) string {
	if _, ok := r.metrics["pullwise-peak-rss-MiB"]; !ok {
		return "-"
	}
	return fmt.Sprintf("%.0f (%.0f)", r.metrics["pullwise-peak-rss-MiB"], r.metrics["stock-peak-rss-MiB"])
}
